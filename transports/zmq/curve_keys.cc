#include "transports/zmq/curve_keys.h"

#include <sodium.h>
#include <zmq.h>

#include <array>

namespace swarm::zmq_transport {

Result<CurveKeyPair> generate_curve_keypair() {
  std::array<char, 41> public_key{}, secret_key{};
  if (zmq_curve_keypair(public_key.data(), secret_key.data()) != 0) {
    return unimplemented("this libzmq has no CURVE support: {}", zmq_strerror(zmq_errno()));
  }
  return CurveKeyPair{public_key.data(), secret_key.data()};
}

Result<CurveKeyPair> derive_curve_keypair(const std::string& secret, const std::string& label) {
  if (secret.empty()) return invalid_argument("the swarm secret is empty");
  if (sodium_init() < 0) return internal("libsodium failed to initialize");
  // Keyed BLAKE2b: the label keys the hash, so different labels give unrelated pairs.
  std::array<unsigned char, 32> secret_bytes{};
  const std::string key = "swarm-curve:" + label;
  crypto_generichash(secret_bytes.data(), secret_bytes.size(),
                     reinterpret_cast<const unsigned char*>(secret.data()), secret.size(),
                     reinterpret_cast<const unsigned char*>(key.data()),
                     std::min<size_t>(key.size(), crypto_generichash_KEYBYTES_MAX));
  std::array<char, 41> secret_z85{}, public_z85{};
  if (zmq_z85_encode(secret_z85.data(), secret_bytes.data(), secret_bytes.size()) == nullptr) {
    return internal("Z85 encoding failed");
  }
  sodium_memzero(secret_bytes.data(), secret_bytes.size());
  if (zmq_curve_public(public_z85.data(), secret_z85.data()) != 0) {
    return unimplemented("this libzmq has no CURVE support: {}", zmq_strerror(zmq_errno()));
  }
  return CurveKeyPair{public_z85.data(), secret_z85.data()};
}

Result<SecurityOptions> shared_secret_security(const std::string& secret, const std::string& label) {
  SWARM_ASSIGN_OR_RETURN(CurveKeyPair pair, derive_curve_keypair(secret, label));
  SecurityOptions options;
  options.curve = true;
  options.keys = pair;
  options.server_public_key = pair.public_key;
  options.allowed_client_keys = {pair.public_key};
  return options;
}

}  // namespace swarm::zmq_transport
