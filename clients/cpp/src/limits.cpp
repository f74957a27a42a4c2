#include "rlserve/limits.hpp"

#include <limits>
#include <type_traits>

#include "rlserve/value.hpp"

namespace rlserve {

Limits Limits::updated_from(const Value& limits) const {
  Limits out = *this;
  auto read = [&limits](const char* name, auto& field) {
    const Value* v = limits.present(name);
    if (v == nullptr) return;
    const auto n = v->as_uint();
    using Field = std::remove_reference_t<decltype(field)>;
    if (n && *n <= std::numeric_limits<Field>::max()) field = static_cast<Field>(*n);
  };
  read("max_frame_bytes", out.max_frame_bytes);
  read("max_array_elements", out.max_array_elements);
  read("max_array_ndim", out.max_array_ndim);
  read("max_container_len", out.max_container_len);
  read("max_id_length", out.max_id_length);
  read("max_episodes_per_client", out.max_episodes_per_client);
  return out;
}

}  // namespace rlserve
