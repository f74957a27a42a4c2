// Model::parse: a `weights` reply's `model` and `arrays` maps, checked (protocol section 7.9).
#include <cmath>
#include <limits>
#include <string>

#include "rlserve/model.hpp"

namespace rlserve {
namespace {

constexpr std::uint64_t kMaxDim = 1u << 26;  // a guard against absurd sizes, far above real nets
constexpr std::size_t kMaxCells = 4096;      // section 7.9

Error bad_model(const std::string& message) { return make_error(ErrorCode::decode_error, "model: " + message); }
Error unsupported(const std::string& message) {
  return make_error(ErrorCode::unsupported_model,
                    "model: " + message + "; this client cannot compute its actions: upgrade the "
                    "client or use remote inference");
}

std::string bracketed_shape(const std::vector<std::uint32_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

/// Reads the maps into a Model; a class so that it may fill Model's private fields.
class ModelParser {
 public:
  ModelParser(const Value& model, const Value& arrays) : model_(model), arrays_(arrays) {}

  Result<Model> run() {
    if (model_.as_map() == nullptr) return bad_model("the description is not a map");
    if (arrays_.as_map() == nullptr) return bad_model("'arrays' is not a map");
    Model m;
    auto obs_dim = size_field("obs_dim");
    if (!obs_dim) return obs_dim.error();
    m.obs_dim_ = *obs_dim;

    const std::string* activation = string_field("activation");
    if (activation == nullptr) return bad_model("'activation' is missing or not a string");
    if (*activation == "tanh") m.activation_ = Activation::tanh;
    else if (*activation == "relu") m.activation_ = Activation::relu;
    else return unsupported("activation '" + *activation + "' is not tanh or relu");

    if (auto s = parse_head_kind(m); !s) return s.error();
    if (auto s = parse_mask(m); !s) return s.error();
    const std::size_t input_dim = m.obs_dim_ - m.mask_size_;
    if (auto s = parse_normalisation(m, input_dim); !s) return s.error();
    m.encoded_dim_ = input_dim;
    if (auto s = parse_encoder(m, input_dim); !s) return s.error();
    std::size_t actor_in = m.encoded_dim_;
    if (auto s = parse_memory(m, actor_in); !s) return s.error();
    if (auto s = parse_layers(m, actor_in); !s) return s.error();
    if (auto s = parse_head(m); !s) return s.error();
    return m;
  }

 private:
  const Value& model_;
  const Value& arrays_;

  const std::string* string_field(const char* name) const {
    const Value* v = model_.present(name);
    return v ? v->as_string() : nullptr;
  }

  Result<std::size_t> size_field(const char* name, const Value* in = nullptr) const {
    const Value* v = (in ? *in : model_).present(name);
    const auto n = v ? v->as_uint() : std::nullopt;
    if (!n || *n > kMaxDim) return bad_model(std::string("'") + name + "' is missing or not an integer in 0.." + std::to_string(kMaxDim));
    return static_cast<std::size_t>(*n);
  }

  /// A list of numbers (nil entries read as `nil_as`).
  Result<std::vector<double>> numbers(const char* name, double nil_as, bool required) const {
    const Value* v = model_.present(name);
    std::vector<double> out;
    if (v == nullptr) {
      if (required) return bad_model(std::string("'") + name + "' is missing");
      return out;
    }
    const auto* list = v->as_array();
    if (list == nullptr) return bad_model(std::string("'") + name + "' is not a list of numbers");
    for (const Value& item : *list) {
      if (item.is_nil()) { out.push_back(nil_as); continue; }
      const auto x = item.as_number();
      if (!x) return bad_model(std::string("'") + name + "' holds something that is not a number");
      out.push_back(*x);
    }
    return out;
  }

  /// arrays[name] as float32 of exactly `shape`.
  Result<std::vector<float>> array(const std::string& name, std::vector<std::uint32_t> shape) const {
    const Value* v = arrays_.present(name);
    if (v == nullptr || v->as_ndarray() == nullptr) return bad_model("array '" + name + "' is missing or not an ndarray");
    const NDArray& a = *v->as_ndarray();
    if (!dtype_is_float(a.dtype())) return bad_model("array '" + name + "' has dtype " + dtype_name(a.dtype()) + "; weights are float32");
    if (a.shape() != shape) {
      return bad_model("array '" + name + "' has shape " + bracketed_shape(a.shape()) + "; the description needs " + bracketed_shape(shape));
    }
    return a.to_floats();
  }

  static std::uint32_t u32(std::size_t n) { return static_cast<std::uint32_t>(n); }

  Status parse_head_kind(Model& m) {
    const std::string* d = string_field("distribution");
    if (d == nullptr) return bad_model("'distribution' is missing or not a string");
    static const std::pair<const char*, DistributionKind> kinds[] = {
        {"categorical", DistributionKind::categorical}, {"gaussian", DistributionKind::gaussian},
        {"multi_categorical", DistributionKind::multi_categorical}, {"bernoulli", DistributionKind::bernoulli},
        {"composite", DistributionKind::composite}, {"epsilon_greedy", DistributionKind::epsilon_greedy},
        {"squashed_gaussian", DistributionKind::squashed_gaussian}};
    for (const auto& [name, kind] : kinds) {
      if (*d == name) {
        m.head_.kind = kind;
        auto dim = size_field("action_dim");
        if (!dim) return dim.error();
        if (*dim == 0) return bad_model("'action_dim' is 0");
        m.head_.action_dim = *dim;
        return ok_status();
      }
    }
    return unsupported("distribution '" + *d + "' is not one this client implements (categorical, gaussian, "
                       "multi_categorical, bernoulli, composite, epsilon_greedy, squashed_gaussian)");
  }

  Status parse_mask(Model& m) {
    const Value* mask = model_.present("action_mask");
    if (mask == nullptr) return ok_status();
    if (mask->as_map() == nullptr) return bad_model("'action_mask' is not a map");
    auto start = size_field("start", mask);
    auto size = size_field("size", mask);
    if (!start) return start.error();
    if (!size) return size.error();
    const auto k = m.head_.kind;
    if (k != DistributionKind::categorical && k != DistributionKind::multi_categorical &&
        k != DistributionKind::epsilon_greedy) {
      return unsupported("a legal-move mask with distribution other than categorical, multi_categorical or epsilon_greedy");
    }
    if (*size == 0 || *size != m.head_.action_dim || *start + *size > m.obs_dim_) {
      return bad_model("'action_mask' {start, size} must lie within obs_dim and size must equal action_dim");
    }
    m.mask_start_ = *start;
    m.mask_size_ = *size;
    return ok_status();
  }

  Status parse_normalisation(Model& m, std::size_t input_dim) {
    auto mean = numbers("obs_mean", NAN, false);
    if (!mean) return mean.error();
    if (mean->empty()) return ok_status();
    auto std_ = numbers("obs_std", NAN, true);
    if (!std_) return std_.error();
    const Value* clip = model_.present("obs_clip");
    if (mean->size() != input_dim || std_->size() != input_dim) {
      return bad_model("'obs_mean' and 'obs_std' need " + std::to_string(input_dim) + " values each");
    }
    if (clip == nullptr || !clip->as_number() || !(*clip->as_number() > 0)) return bad_model("'obs_clip' must be a positive number");
    for (std::size_t i = 0; i < input_dim; ++i) {
      if (!std::isfinite((*mean)[i]) || !((*std_)[i] > 0) || !std::isfinite((*std_)[i])) {
        return bad_model("'obs_mean' must be finite and 'obs_std' finite and positive");
      }
      m.obs_mean_.push_back(static_cast<float>((*mean)[i]));
      m.obs_std_.push_back(static_cast<float>((*std_)[i]));
    }
    m.obs_clip_ = static_cast<float>(*clip->as_number());
    return ok_status();
  }

  Status parse_encoder(Model& m, std::size_t input_dim) {
    const Value* enc = model_.present("encoder");
    if (enc == nullptr) return ok_status();
    if (enc->as_map() == nullptr) return bad_model("'encoder' is not a map");
    auto in = size_field("input_dim", enc);
    if (!in) return in.error();
    if (*in != input_dim) return bad_model("'encoder.input_dim' is " + std::to_string(*in) + "; the observation gives " + std::to_string(input_dim));
    const Value* images = enc->present("images");
    if (images == nullptr || images->as_array() == nullptr) return bad_model("'encoder.images' is not a list");
    std::vector<ImageEncoder> out;
    std::size_t encoded = input_dim, next_free = 0;
    for (const Value& img : *images->as_array()) {
      if (img.as_map() == nullptr) return bad_model("an encoder image is not a map");
      const Value* kind = img.present("kind");
      if (kind == nullptr || kind->as_string() == nullptr) return bad_model("an encoder image has no 'kind'");
      if (*kind->as_string() != "conv") return unsupported("encoder kind '" + *kind->as_string() + "'");
      ImageEncoder e;
      auto start = size_field("start", &img);
      if (!start) return start.error();
      e.start = *start;
      const Value* cf = img.present("channels_first");
      e.channels_first = cf && cf->as_bool() && *cf->as_bool();
      const Value* shape = img.present("shape");
      if (shape == nullptr || shape->as_array() == nullptr || shape->as_array()->size() != 3) return bad_model("an encoder image's 'shape' is not 3 integers");
      std::size_t dims[3];
      for (int k = 0; k < 3; ++k) {
        const auto n = (*shape->as_array())[static_cast<std::size_t>(k)].as_uint();
        if (!n || *n == 0 || *n > kMaxDim) return bad_model("an encoder image's 'shape' is not 3 positive integers");
        dims[k] = static_cast<std::size_t>(*n);
      }
      if (e.channels_first) { e.channels = dims[0]; e.height = dims[1]; e.width = dims[2]; }
      else { e.height = dims[0]; e.width = dims[1]; e.channels = dims[2]; }
      if (e.start < next_free || e.start + e.input_dim() > input_dim) return bad_model("encoder images overlap, are out of order or leave the input");
      next_free = e.start + e.input_dim();
      const Value* div = img.present("divisor");
      e.divisor = div && div->as_number() ? static_cast<float>(*div->as_number()) : 1.0f;
      if (!(e.divisor > 0)) return bad_model("an encoder image's 'divisor' must be positive");
      const Value* act = img.present("activation");
      if (act && act->as_string() && *act->as_string() != "relu") return unsupported("encoder activation '" + *act->as_string() + "'");
      const Value* layers = img.present("layers");
      if (layers == nullptr || layers->as_array() == nullptr || layers->as_array()->empty()) return bad_model("an encoder image has no 'layers'");
      std::size_t c = e.channels, h = e.height, w = e.width, flat = 0;
      bool seen_linear = false;
      for (const Value& lv : *layers->as_array()) {
        const Value* name = lv.present("name");
        const Value* lk = lv.present("kind");
        if (name == nullptr || !name->as_string() || lk == nullptr || !lk->as_string()) return bad_model("an encoder layer needs 'name' and 'kind'");
        auto size = size_field("size", &lv);
        if (!size) return size.error();
        if (*size == 0) return bad_model("an encoder layer has size 0");
        EncoderLayer layer;
        layer.size = *size;
        const std::string& n = *name->as_string();
        if (*lk->as_string() == "conv") {
          if (seen_linear) return bad_model("an encoder's conv layer follows a linear one");
          const Value* kernel = lv.present("kernel");
          const Value* stride = lv.present("stride");
          auto pair = [](const Value* v, std::size_t& a, std::size_t& b) {
            if (v == nullptr || v->as_array() == nullptr || v->as_array()->size() != 2) return false;
            const auto x = (*v->as_array())[0].as_uint(), y = (*v->as_array())[1].as_uint();
            if (!x || !y || *x == 0 || *y == 0 || *x > kMaxDim || *y > kMaxDim) return false;
            a = static_cast<std::size_t>(*x);
            b = static_cast<std::size_t>(*y);
            return true;
          };
          if (!pair(kernel, layer.kh, layer.kw) || !pair(stride, layer.sh, layer.sw)) return bad_model("conv layer '" + n + "' needs positive 'kernel' and 'stride' pairs");
          if (layer.kh > h || layer.kw > w) return bad_model("conv layer '" + n + "' has a kernel larger than its input");
          layer.conv = true;
          layer.in_channels = c; layer.in_height = h; layer.in_width = w;
          auto wt = array(n + ".weight", {u32(layer.size), u32(c), u32(layer.kh), u32(layer.kw)});
          if (!wt) return wt.error();
          layer.weight = std::move(wt).value();
          c = layer.size;
          h = (h - layer.kh) / layer.sh + 1;
          w = (w - layer.kw) / layer.sw + 1;
          flat = c * h * w;
        } else if (*lk->as_string() == "linear") {
          if (!seen_linear) flat = c * h * w;
          seen_linear = true;
          layer.in = flat;
          auto wt = array(n + ".weight", {u32(layer.size), u32(flat)});
          if (!wt) return wt.error();
          layer.weight = std::move(wt).value();
          flat = layer.size;
        } else {
          return unsupported("encoder layer kind '" + *lk->as_string() + "'");
        }
        auto b = array(n + ".bias", {u32(layer.size)});
        if (!b) return b.error();
        layer.bias = std::move(b).value();
        e.layers.push_back(std::move(layer));
      }
      e.output_dim = flat;
      encoded = encoded - e.input_dim() + e.output_dim;
      out.push_back(std::move(e));
    }
    m.encoder_ = std::move(out);
    m.encoded_dim_ = encoded;
    return ok_status();
  }

  Status parse_memory(Model& m, std::size_t& actor_in) {
    const Value* mem = model_.present("memory");
    if (mem == nullptr) return ok_status();
    if (mem->as_map() == nullptr) return bad_model("'memory' is not a map");
    const Value* kind = mem->present("kind");
    if (kind == nullptr || kind->as_string() == nullptr) return bad_model("'memory' has no 'kind'");
    if (*kind->as_string() != "lstm") return unsupported("memory kind '" + *kind->as_string() + "'");
    auto cells = size_field("cell_size", mem);
    if (!cells) return cells.error();
    if (*cells == 0 || *cells > kMaxCells) return bad_model("'memory.cell_size' must be 1.." + std::to_string(kMaxCells));
    Lstm l;
    l.cells = *cells;
    l.input = m.encoded_dim_;
    auto ih = array("memory.weight_ih", {u32(4 * l.cells), u32(l.input)});
    if (!ih) return ih.error();
    auto hh = array("memory.weight_hh", {u32(4 * l.cells), u32(l.cells)});
    if (!hh) return hh.error();
    auto b = array("memory.bias", {u32(4 * l.cells)});
    if (!b) return b.error();
    l.weight_ih = std::move(ih).value();
    l.weight_hh = std::move(hh).value();
    l.bias = std::move(b).value();
    actor_in = l.cells;
    m.memory_ = std::move(l);
    return ok_status();
  }

  Status parse_layers(Model& m, std::size_t actor_in) {
    const Value* names = model_.present("actor_layers");
    if (names == nullptr || names->as_array() == nullptr || names->as_array()->empty()) {
      return bad_model("'actor_layers' is not a non-empty list of names");
    }
    std::size_t in = actor_in;
    for (const Value& nv : *names->as_array()) {
      if (nv.as_string() == nullptr) return bad_model("'actor_layers' holds something that is not a string");
      const std::string& name = *nv.as_string();
      const Value* wv = arrays_.present(name + ".weight");
      if (wv == nullptr || wv->as_ndarray() == nullptr || wv->as_ndarray()->shape().size() != 2) {
        return bad_model("array '" + name + ".weight' is missing or not 2-dimensional");
      }
      Dense d;
      d.in = in;
      d.out = wv->as_ndarray()->shape()[0];
      auto w = array(name + ".weight", {u32(d.out), u32(in)});
      if (!w) return w.error();
      auto b = array(name + ".bias", {u32(d.out)});
      if (!b) return b.error();
      d.weight = std::move(w).value();
      d.bias = std::move(b).value();
      in = d.out;
      m.layers_.push_back(std::move(d));
    }
    if (in != m.head_.action_dim) {
      return bad_model("the last actor layer has " + std::to_string(in) + " outputs; 'action_dim' is " +
                 std::to_string(m.head_.action_dim));
    }
    return ok_status();
  }

  Result<std::vector<ActionPart>> parts() const {
    const Value* v = model_.present("action_parts");
    std::vector<ActionPart> out;
    if (v == nullptr || v->as_array() == nullptr) return bad_model("'action_parts' is missing or not a list");
    for (const Value& p : *v->as_array()) {
      const Value* kind = p.present("kind");
      if (kind == nullptr || kind->as_string() == nullptr) return bad_model("an action part has no 'kind'");
      auto size = size_field("size", &p);
      if (!size) return size.error();
      if (*size == 0) return bad_model("an action part has size 0");
      const std::string& k = *kind->as_string();
      PartKind pk;
      if (k == "categorical") pk = PartKind::categorical;
      else if (k == "bernoulli") pk = PartKind::bernoulli;
      else if (k == "gaussian") pk = PartKind::gaussian;
      else if (k == "squashed_gaussian") pk = PartKind::squashed_gaussian;
      else return unsupported("action part kind '" + k + "'");
      out.push_back({pk, *size});
    }
    if (out.empty()) return bad_model("'action_parts' is empty");
    return out;
  }

  Status parse_head(Model& m) {
    Head& h = m.head_;
    const std::size_t n = h.action_dim;
    const double inf = std::numeric_limits<double>::infinity();
    const Value* start_v = model_.present("action_start");
    const std::int64_t start = start_v && start_v->as_int() ? *start_v->as_int() : 0;
    switch (h.kind) {
      case DistributionKind::categorical:
      case DistributionKind::epsilon_greedy:
        h.parts = {{PartKind::categorical, n}};
        break;
      case DistributionKind::gaussian:
        h.parts = {{PartKind::gaussian, n}};
        break;
      default: {
        auto p = parts();
        if (!p) return p.error();
        h.parts = std::move(p).value();
      }
    }
    std::size_t outputs = 0, gaussians = 0, squashed = 0;
    for (const auto& p : h.parts) {
      outputs += p.kind == PartKind::squashed_gaussian ? 2 * p.size : p.size;
      if (p.kind == PartKind::gaussian) gaussians += p.size;
      if (p.kind == PartKind::squashed_gaussian) ++squashed;
    }
    if (outputs != n) return bad_model("the action parts read " + std::to_string(outputs) + " outputs; 'action_dim' is " + std::to_string(n));
    if ((h.kind == DistributionKind::squashed_gaussian) != (squashed > 0) || (squashed > 0 && h.parts.size() != 1)) {
      return bad_model("a squashed_gaussian part stands alone, and only in a squashed_gaussian model");
    }
    const std::size_t cols = h.columns();
    if (h.kind == DistributionKind::categorical || h.kind == DistributionKind::epsilon_greedy) {
      h.offsets = {static_cast<double>(start)};
      h.low = {-inf};
      h.high = {inf};
    } else {
      auto low = numbers("action_low", -inf, false);
      auto high = numbers("action_high", inf, false);
      if (!low) return low.error();
      if (!high) return high.error();
      h.low = low->empty() ? std::vector<double>(cols, -inf) : std::move(low).value();
      h.high = high->empty() ? std::vector<double>(cols, inf) : std::move(high).value();
      if (h.low.size() != cols || h.high.size() != cols) return bad_model("'action_low'/'action_high' need one value per action column (" + std::to_string(cols) + ")");
      auto off = numbers("action_offsets", 0.0, false);
      if (!off) return off.error();
      h.offsets = off->empty() ? std::vector<double>(cols, 0.0) : std::move(off).value();
      if (h.offsets.size() != cols) return bad_model("'action_offsets' needs one value per action column");
      if (h.kind == DistributionKind::squashed_gaussian) {
        for (std::size_t c = 0; c < cols; ++c) {
          if (!std::isfinite(h.low[c]) || !std::isfinite(h.high[c]) || !(h.high[c] > h.low[c])) {
            return bad_model("a squashed_gaussian needs finite bounds with high > low");
          }
        }
      }
    }
    if (gaussians > 0) {
      auto ls = array("log_std", {u32(gaussians)});
      if (!ls) return ls.error();
      h.log_std = std::move(ls).value();
    }
    auto scale = numbers("action_scale", 1.0, false);
    auto bias = numbers("action_bias", 0.0, false);
    if (!scale) return scale.error();
    if (!bias) return bias.error();
    if (!scale->empty()) {
      if (scale->size() != cols || bias->size() != cols) return bad_model("'action_scale' and 'action_bias' need one value per action column");
      for (std::size_t c = 0; c < cols; ++c) {
        h.scale.push_back(static_cast<float>((*scale)[c]));
        h.bias.push_back(static_cast<float>((*bias)[c]));
      }
    }
    if (h.kind == DistributionKind::epsilon_greedy) {
      const Value* eps = model_.present("epsilon");
      h.epsilon = eps && eps->as_number() ? *eps->as_number() : 0.0;
      if (!(h.epsilon >= 0.0 && h.epsilon <= 1.0)) return bad_model("'epsilon' must be within [0, 1]");
    }
    return ok_status();
  }
};

std::size_t Head::columns() const noexcept {
  std::size_t c = 0;
  for (const auto& p : parts) c += p.kind == PartKind::categorical ? 1 : p.size;
  return c;
}

Result<Model> Model::parse(const Value& model, const Value& arrays) {
  return ModelParser(model, arrays).run();
}

}  // namespace rlserve
