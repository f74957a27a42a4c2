// Model::forward: mask, normalisation, image encoders, LSTM and the actor layers (section 14.4).
#include <algorithm>
#include <cmath>

#include "rlserve/model.hpp"

namespace rlserve {
namespace {

/// out = W x + b, with W [out, in] row-major; sums in double, results rounded to float32.
/// Four partial sums per row: one running sum waits on each addition's latency (about four
/// times slower on a 64x64 layer); in double the order changes nothing a float32 result shows.
void dense(const std::vector<float>& w, const std::vector<float>& b, std::size_t in, std::size_t out,
           const float* x, float* y) {
  const std::size_t in4 = in - in % 4;
  for (std::size_t j = 0; j < out; ++j) {
    const float* row = w.data() + j * in;
    double s0 = b[j], s1 = 0, s2 = 0, s3 = 0;
    for (std::size_t i = 0; i < in4; i += 4) {
      s0 += static_cast<double>(row[i]) * x[i];
      s1 += static_cast<double>(row[i + 1]) * x[i + 1];
      s2 += static_cast<double>(row[i + 2]) * x[i + 2];
      s3 += static_cast<double>(row[i + 3]) * x[i + 3];
    }
    for (std::size_t i = in4; i < in; ++i) s0 += static_cast<double>(row[i]) * x[i];
    y[j] = static_cast<float>((s0 + s1) + (s2 + s3));
  }
}

float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

/// One image through its conv stack; writes output_dim values to `out`.
void encode_image(const ImageEncoder& e, const float* x, float* out) {
  // The image as [C, H, W], divided by its divisor (in float32).
  std::vector<float> map(e.input_dim());
  for (std::size_t c = 0; c < e.channels; ++c) {
    for (std::size_t i = 0; i < e.height; ++i) {
      for (std::size_t j = 0; j < e.width; ++j) {
        const std::size_t src = e.channels_first ? (c * e.height + i) * e.width + j
                                                 : (i * e.width + j) * e.channels + c;
        map[(c * e.height + i) * e.width + j] = x[src] / e.divisor;
      }
    }
  }
  std::vector<float> next;
  for (const EncoderLayer& l : e.layers) {
    if (l.conv) {
      const std::size_t ho = (l.in_height - l.kh) / l.sh + 1, wo = (l.in_width - l.kw) / l.sw + 1;
      next.assign(l.size * ho * wo, 0.0f);
      for (std::size_t f = 0; f < l.size; ++f) {
        for (std::size_t i = 0; i < ho; ++i) {
          for (std::size_t j = 0; j < wo; ++j) {
            double s = l.bias[f];
            for (std::size_t c = 0; c < l.in_channels; ++c) {
              for (std::size_t u = 0; u < l.kh; ++u) {
                const float* in_row = map.data() + (c * l.in_height + i * l.sh + u) * l.in_width + j * l.sw;
                const float* w_row = l.weight.data() + ((f * l.in_channels + c) * l.kh + u) * l.kw;
                for (std::size_t v = 0; v < l.kw; ++v) s += static_cast<double>(in_row[v]) * w_row[v];
              }
            }
            next[(f * ho + i) * wo + j] = std::max(static_cast<float>(s), 0.0f);
          }
        }
      }
    } else {
      next.assign(l.size, 0.0f);
      dense(l.weight, l.bias, l.in, l.size, map.data(), next.data());
      for (float& v : next) v = std::max(v, 0.0f);
    }
    map.swap(next);
  }
  std::copy(map.begin(), map.end(), out);
}

}  // namespace

void Model::forward(const float* obs, const float* state_in, float* state_out, std::vector<float>& y,
                    std::vector<std::uint8_t>& legal, ForwardTrace* trace) const {
  // The mask's values are read, not fed to the network (section 14.4.2).
  const std::size_t n_out = head_.action_dim;
  legal.assign(n_out, 1);
  std::vector<float> x;
  x.reserve(obs_dim_ - mask_size_);
  for (std::size_t i = 0; i < obs_dim_; ++i) {
    if (i >= mask_start_ && i < mask_start_ + mask_size_) {
      legal[i - mask_start_] = obs[i] > 0.5f ? 1 : 0;
    } else {
      x.push_back(obs[i]);
    }
  }
  if (!obs_mean_.empty()) {
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float z = (x[i] - obs_mean_[i]) / obs_std_[i];
      x[i] = std::min(std::max(z, -obs_clip_), obs_clip_);
    }
  }
  if (trace) trace->network_input = x;

  if (encoder_) {
    std::vector<float> encoded;
    encoded.reserve(encoded_dim_);
    std::size_t pos = 0;
    for (const ImageEncoder& e : *encoder_) {
      encoded.insert(encoded.end(), x.begin() + static_cast<std::ptrdiff_t>(pos),
                     x.begin() + static_cast<std::ptrdiff_t>(e.start));
      const std::size_t at = encoded.size();
      encoded.resize(at + e.output_dim);
      encode_image(e, x.data() + e.start, encoded.data() + at);
      pos = e.start + e.input_dim();
    }
    encoded.insert(encoded.end(), x.begin() + static_cast<std::ptrdiff_t>(pos), x.end());
    x.swap(encoded);
  }
  if (trace) trace->encoded = x;

  if (memory_) {
    const Lstm& l = *memory_;
    const std::size_t n = l.cells;
    std::vector<float> gates(4 * n), h(state_in, state_in + n), c(state_in + n, state_in + 2 * n);
    for (std::size_t j = 0; j < 4 * n; ++j) {
      double s = l.bias[j];
      for (std::size_t i = 0; i < l.input; ++i) s += static_cast<double>(l.weight_ih[j * l.input + i]) * x[i];
      for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(l.weight_hh[j * n + i]) * h[i];
      gates[j] = static_cast<float>(s);
    }
    if (trace) trace->gates = gates;
    for (std::size_t j = 0; j < n; ++j) {
      const float cn = sigmoid(gates[n + j]) * c[j] + sigmoid(gates[j]) * std::tanh(gates[2 * n + j]);
      const float hn = sigmoid(gates[3 * n + j]) * std::tanh(cn);
      state_out[j] = hn;
      state_out[n + j] = cn;
    }
    x.assign(state_out, state_out + n);
  }

  std::vector<float> next;
  for (std::size_t k = 0; k < layers_.size(); ++k) {
    const Dense& d = layers_[k];
    next.assign(d.out, 0.0f);
    dense(d.weight, d.bias, d.in, d.out, x.data(), next.data());
    if (k + 1 < layers_.size()) {
      for (float& v : next) v = activation_ == Activation::tanh ? std::tanh(v) : std::max(v, 0.0f);
      if (k == 0 && trace) trace->hidden = next;
    }
    x.swap(next);
  }
  for (std::size_t j = 0; j < n_out; ++j) {
    if (!legal[j]) x[j] = kMaskedOutput;
  }
  y = std::move(x);
}

}  // namespace rlserve
