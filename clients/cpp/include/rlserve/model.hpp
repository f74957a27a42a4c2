// A policy's network as a `weights` reply describes it, and its forward pass
// (docs/protocol.md sections 7.9, 14.4, 14.4.2 and 14.4.3).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "rlserve/error.hpp"
#include "rlserve/value.hpp"

namespace rlserve {

/// The hidden layers' activation.
enum class Activation { tanh, relu };

/// `model.distribution`.
enum class DistributionKind {
  categorical, gaussian, multi_categorical, bernoulli, composite, epsilon_greedy, squashed_gaussian,
};

/// The kind of one part of the action (`model.action_parts`).
enum class PartKind { categorical, bernoulli, gaussian, squashed_gaussian };

/// One part: it reads `size` outputs (2*size for squashed_gaussian) and fills `size` columns of
/// the flat action row (one for categorical).
struct ActionPart {
  PartKind kind;
  std::size_t size;
};

/// A linear layer: weight [out, in] row-major, bias [out].
struct Dense {
  std::size_t in = 0, out = 0;
  std::vector<float> weight, bias;
};

/// One layer of an image encoder: a valid convolution or a linear layer, ReLU after each.
struct EncoderLayer {
  bool conv = false;
  std::size_t size = 0;               ///< filters or outputs
  std::size_t kh = 0, kw = 0, sh = 1, sw = 1;
  std::size_t in_channels = 0, in_height = 0, in_width = 0;  ///< conv: the input map
  std::size_t in = 0;                 ///< linear: the input length
  std::vector<float> weight, bias;
};

/// One image of `model.encoder`: the slice x[start, start + H*W*C) and its conv stack.
struct ImageEncoder {
  std::size_t start = 0, height = 0, width = 0, channels = 0;
  bool channels_first = false;
  float divisor = 1.0f;
  std::vector<EncoderLayer> layers;
  std::size_t output_dim = 0;
  std::size_t input_dim() const noexcept { return height * width * channels; }
};

/// An LSTM of `cells` cells reading `input` values (PyTorch gate order i, f, g, o).
struct Lstm {
  std::size_t cells = 0, input = 0;
  std::vector<float> weight_ih, weight_hh, bias;
};

/// How the network's output becomes an action (section 14.4). Every kind is normalised to
/// parts, per-column offsets and bounds, so that the value sent for column c is
/// clip(row[c] + offsets[c], low[c], high[c]).
struct Head {
  DistributionKind kind = DistributionKind::categorical;
  std::size_t action_dim = 0;         ///< the network's output width
  std::vector<ActionPart> parts;      ///< epsilon_greedy: one categorical part
  std::vector<double> low, high;      ///< per column (infinite where unbounded)
  std::vector<double> offsets;        ///< per column (action_start for a Discrete space)
  std::vector<float> log_std;         ///< the Gaussian parts' log standard deviations
  std::vector<float> scale, bias;     ///< per column; empty without action_scale
  double epsilon = 0.0;               ///< epsilon_greedy's exploration probability
  /// Width of the flat action row (section 6.3).
  std::size_t columns() const noexcept;
};

/// Intermediate results of one forward pass, for checking against the protocol vectors.
struct ForwardTrace {
  std::vector<float> network_input;  ///< after the mask is removed and normalisation
  std::vector<float> encoded;        ///< what the LSTM or the first actor layer reads
  std::vector<float> gates;          ///< the LSTM's 4N gate pre-activations
  std::vector<float> hidden;         ///< the first actor layer's output after its activation
};

/// The network of one weights version. Immutable once built, so one Model may serve many
/// threads at once.
class Model {
 public:
  /// Builds the model from a `weights` reply's `model` and `arrays` maps, checking every field
  /// and array shape: decode_error for a malformed description, unsupported_model (naming the
  /// kind) for anything this library does not implement.
  static Result<Model> parse(const Value& model, const Value& arrays);

  /// `model.obs_dim`: the flattened observation's length.
  std::size_t obs_dim() const noexcept { return obs_dim_; }
  /// Floats of recurrent state per episode: 2 * cell_size with memory, else 0.
  std::size_t state_size() const noexcept { return memory_ ? 2 * memory_->cells : 0; }
  /// Whether the model reads a legal-move mask from the observation.
  bool has_mask() const noexcept { return mask_size_ > 0; }
  const Head& head() const noexcept { return head_; }

  /// One forward pass of one flattened observation (obs_dim floats). With memory, reads
  /// `state_in` and writes `state_out` (state_size floats each; they may alias). Writes the
  /// network's output, masked where the model has a mask, to `y` (action_dim floats) and which
  /// outputs are legal to `legal` (all 1 without a mask).
  void forward(const float* obs, const float* state_in, float* state_out, std::vector<float>& y,
               std::vector<std::uint8_t>& legal, ForwardTrace* trace = nullptr) const;

 private:
  friend class ModelParser;
  std::size_t obs_dim_ = 0;
  std::size_t mask_start_ = 0, mask_size_ = 0;
  std::vector<float> obs_mean_, obs_std_;
  float obs_clip_ = 0.0f;
  std::optional<std::vector<ImageEncoder>> encoder_;
  std::size_t encoded_dim_ = 0;
  std::optional<Lstm> memory_;
  Activation activation_ = Activation::tanh;
  std::vector<Dense> layers_;
  Head head_;
};

/// The value an illegal output is set to: float32 lowest / 2 (section 14.4.2).
constexpr float kMaskedOutput = -1.7014117e38f;

}  // namespace rlserve
