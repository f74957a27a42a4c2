// Writes the C test's inputs from messages.json: the server's `weights` body as it is, and the
// same body with its distribution renamed to one no client implements.
#include <cstdio>
#include <fstream>
#include <string>

#include "rlserve/codec.hpp"
#include "vectors.hpp"

namespace {

bool write(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: write_fixtures <messages.json> <output folder>\n");
    return 2;
  }
  const std::string dir = argv[2];
  const auto file = vectors::load(argv[1]);
  for (const auto& v : file.at("vectors")) {
    if (v.at("name") != "weights") continue;
    const auto body = vectors::from_hex(v.at("msgpack").get<std::string>());
    rlserve::Value message = vectors::from_tagged(v.at("value"));
    for (auto& [k, field] : *message.as_map()) {
      if (k != "model") continue;
      for (auto& [mk, mv] : *field.as_map()) {
        if (mk == "distribution") mv = "beta";
      }
    }
    if (!write(dir + "/weights.bin", body) || !write(dir + "/weights_beta.bin", rlserve::encode(message))) {
      std::fprintf(stderr, "cannot write to %s\n", dir.c_str());
      return 1;
    }
    return 0;
  }
  std::fprintf(stderr, "no 'weights' vector in %s\n", argv[1]);
  return 1;
}
