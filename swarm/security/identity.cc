#include "swarm/security/identity.h"

#include <sodium.h>
#include <zmq.h>

#include <algorithm>

namespace swarm::security {
namespace {

Status ensure_sodium() {
  if (sodium_init() < 0) return internal("libsodium failed to initialize");
  return Status::ok();
}

// Keyed BLAKE2b-256 of `secret` under a label, so each derived key is unrelated to the others.
std::array<unsigned char, 32> derive(const std::string& secret, std::string_view label) {
  std::array<unsigned char, 32> out{};
  crypto_generichash(out.data(), out.size(), reinterpret_cast<const unsigned char*>(secret.data()), secret.size(),
                     reinterpret_cast<const unsigned char*>(label.data()),
                     std::min<size_t>(label.size(), crypto_generichash_KEYBYTES_MAX));
  return out;
}

Result<std::string> z85(const unsigned char* bytes) {
  char text[41] = {};
  if (zmq_z85_encode(text, bytes, 32) == nullptr) return internal("Z85 encoding failed");
  return std::string(text);
}

// A CURVE pair from a raw X25519 secret key.
Result<CurveKeyPair> curve_pair(const unsigned char* secret_key) {
  SWARM_ASSIGN_OR_RETURN(std::string secret_z85, z85(secret_key));
  char public_z85[41] = {};
  if (zmq_curve_public(public_z85, secret_z85.c_str()) != 0) {
    return unimplemented("this libzmq has no CURVE support: {}", zmq_strerror(zmq_errno()));
  }
  return CurveKeyPair{public_z85, secret_z85};
}

std::string fingerprint_of_raw_curve_key(const unsigned char* key) {
  unsigned char digest[kFingerprintHexChars / 2];
  crypto_generichash(digest, sizeof digest, key, 32, nullptr, 0);
  return to_hex(digest, sizeof digest);
}

Result<SwarmIdentity> fresh_identity() {
  std::array<unsigned char, 32> seed{};
  randombytes_buf(seed.data(), seed.size());
  auto identity = identity_from_seed(seed);
  sodium_memzero(seed.data(), seed.size());
  return identity;
}

}  // namespace

SecurityOptions SwarmCredentials::server_options() const {
  SecurityOptions options;
  options.curve = true;
  options.keys = swarm_server;
  return options;
}

SecurityOptions SwarmCredentials::client_options() const {
  SecurityOptions options;
  options.curve = true;
  options.keys = self.curve;
  options.server_public_key = swarm_server.public_key;
  return options;
}

Result<SwarmCredentials> join_swarm(const std::string& secret) {
  if (secret.empty()) return invalid_argument("the swarm secret is empty");
  SWARM_RETURN_IF_ERROR(ensure_sodium());
  SwarmCredentials credentials;
  std::array<unsigned char, 32> server_secret = derive(secret, "swarm-server-curve-v1");
  auto server = curve_pair(server_secret.data());
  sodium_memzero(server_secret.data(), server_secret.size());
  if (!server.is_ok()) return server.status();
  credentials.swarm_server = std::move(server).value();
  credentials.membership_key = derive(secret, "swarm-membership-v1");
  SWARM_ASSIGN_OR_RETURN(credentials.self, fresh_identity());
  return credentials;
}

Result<SwarmIdentity> identity_from_seed(const std::array<unsigned char, 32>& seed) {
  SWARM_RETURN_IF_ERROR(ensure_sodium());
  SwarmIdentity identity;
  crypto_sign_seed_keypair(identity.signing_public.data(), identity.signing_secret.data(), seed.data());
  unsigned char curve_secret[32];
  if (crypto_sign_ed25519_sk_to_curve25519(curve_secret, identity.signing_secret.data()) != 0) {
    return internal("cannot convert the signing key to a CURVE key");
  }
  auto pair = curve_pair(curve_secret);
  sodium_memzero(curve_secret, sizeof curve_secret);
  if (!pair.is_ok()) return pair.status();
  identity.curve = std::move(pair).value();
  SWARM_ASSIGN_OR_RETURN(identity.fingerprint, fingerprint_of_signing_key(identity.signing_public));
  return identity;
}

Result<std::string> fingerprint_of_curve_key(std::string_view z85_public_key) {
  if (z85_public_key.size() != 40) return invalid_argument("a CURVE public key is 40 Z85 characters");
  std::string text(z85_public_key);
  unsigned char raw[32];
  if (zmq_z85_decode(raw, text.c_str()) == nullptr) return invalid_argument("not Z85 text");
  return fingerprint_of_raw_curve_key(raw);
}

Result<std::string> fingerprint_of_signing_key(const std::array<unsigned char, 32>& signing_public) {
  SWARM_RETURN_IF_ERROR(ensure_sodium());
  unsigned char curve_public[32];
  if (crypto_sign_ed25519_pk_to_curve25519(curve_public, signing_public.data()) != 0) {
    return invalid_argument("not an Ed25519 public key");
  }
  return fingerprint_of_raw_curve_key(curve_public);
}

Result<std::string> peer_id_bound_to(std::string_view name, const SwarmIdentity& identity) {
  if (name.empty() || name.find('.') != std::string_view::npos) {
    return invalid_argument("a peer name must be non-empty and contain no '.': '{}'", name);
  }
  return std::string(name) + "." + identity.fingerprint;
}

std::string_view fingerprint_in(std::string_view peer_id) {
  const size_t dot = peer_id.rfind('.');
  if (dot == std::string_view::npos || peer_id.size() - dot - 1 != kFingerprintHexChars) return {};
  return peer_id.substr(dot + 1);
}

bool speaks_for(std::string_view peer_id, const PeerIdentity& sender) {
  constexpr std::string_view kCurve = "curve:";
  if (!sender.id.starts_with(kCurve)) return false;
  const std::string_view claimed = fingerprint_in(peer_id);
  if (claimed.empty()) return false;
  auto actual = fingerprint_of_curve_key(std::string_view(sender.id).substr(kCurve.size()));
  return actual.is_ok() && *actual == claimed;
}

std::string membership_tag(const std::array<unsigned char, 32>& membership_key,
                           const std::array<unsigned char, 32>& signing_public) {
  unsigned char tag[32];
  crypto_generichash(tag, sizeof tag, signing_public.data(), signing_public.size(), membership_key.data(),
                     membership_key.size());
  return to_hex(tag, sizeof tag);
}

std::string to_hex(const unsigned char* data, size_t size) {
  std::string out(size * 2 + 1, '\0');
  sodium_bin2hex(out.data(), out.size(), data, size);
  out.pop_back();
  return out;
}

bool from_hex(std::string_view text, unsigned char* out, size_t size) {
  if (text.size() != size * 2) return false;
  size_t written = 0;
  const char* end = nullptr;
  return sodium_hex2bin(out, size, text.data(), text.size(), nullptr, &written, &end) == 0 && written == size &&
         end == text.data() + text.size();
}

}  // namespace swarm::security
