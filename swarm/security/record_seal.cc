#include "swarm/security/record_seal.h"

#include <sodium.h>

#include <memory>

#include <nlohmann/json.hpp>

#include "swarm/security/certificate.h"

namespace swarm::security {
namespace {

// Every stored field, in one unambiguous encoding (a JSON array).
std::string signed_bytes(const StoredRecord& record, std::string_view value) {
  return nlohmann::json::array({"swarm-record-v1", record.scope, record.subkey, record.seq, record.expires_at,
                                std::string(value)})
      .dump();
}

Result<std::string> seal(const SwarmCredentials& credentials, const StoredRecord& record) {
  const std::string message = signed_bytes(record, record.value);
  unsigned char signature[crypto_sign_BYTES];
  crypto_sign_detached(signature, nullptr, reinterpret_cast<const unsigned char*>(message.data()), message.size(),
                       credentials.self.signing_secret.data());
  nlohmann::json sealed{{"value", record.value},
                        {"signer", to_hex(credentials.self.signing_public.data(), 32)},
                        {"member", membership_tag(credentials.membership_key, credentials.self.signing_public)},
                        {"signature", to_hex(signature, sizeof signature)}};
  if (!credentials.certificate.empty()) sealed["certificate"] = credentials.certificate;
  return sealed.dump();
}

Result<std::string> string_field(const nlohmann::json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || !it->is_string()) return invalid_argument("unsigned record: no string field '{}'", name);
  return it->get<std::string>();
}

// A value that names its announcer must name the subkey it is stored under.
Status names_its_subkey(const std::string& value, const std::string& subkey) {
  auto j = nlohmann::json::parse(value, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::ok();
  auto peer = j.find("peer");
  if (peer == j.end()) return Status::ok();
  if (!peer->is_string() || peer->get<std::string>() != subkey) {
    return permission_denied("forged record: it names a peer other than its announcer {}", subkey);
  }
  return Status::ok();
}

// In a swarm with an owner, a signer counts only as a certified peer: minted
// identities (no certificate) and trainers' keys publish nothing the members read.
Status certified(const nlohmann::json& sealed, const SigningKey& owner, const SigningKey& signer, int64_t now) {
  auto field = sealed.find("certificate");
  if (field == sealed.end() || !field->is_string()) {
    return permission_denied("uncertified record: this swarm has an owner and the signer shows no certificate");
  }
  auto certificate = certificate_from_text(field->get<std::string>());
  if (!certificate.is_ok()) return permission_denied("uncertified record: {}", certificate.status().message());
  Status admitted = check_certificate(*certificate, owner, signer, now);
  if (!admitted.is_ok()) return permission_denied("uncertified record: {}", admitted.message());
  if (certificate->role != MemberRole::peer) {
    return permission_denied("uncertified record: a {} certificate announces nothing", role_name(certificate->role));
  }
  return Status::ok();
}

Result<std::string> open(const SwarmCredentials& credentials, const StoredRecord& record, int64_t now) {
  const std::array<unsigned char, 32>& membership_key = credentials.membership_key;
  if (record.value.size() > kMaxSealedBytes) return invalid_argument("sealed record of {} bytes", record.value.size());
  auto j = nlohmann::json::parse(record.value, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("unsigned record: not a sealed JSON object");
  SWARM_ASSIGN_OR_RETURN(std::string value, string_field(j, "value"));
  SWARM_ASSIGN_OR_RETURN(std::string signer_hex, string_field(j, "signer"));
  SWARM_ASSIGN_OR_RETURN(std::string member_hex, string_field(j, "member"));
  SWARM_ASSIGN_OR_RETURN(std::string signature_hex, string_field(j, "signature"));
  std::array<unsigned char, 32> signer{};
  unsigned char signature[crypto_sign_BYTES];
  if (!from_hex(signer_hex, signer.data(), signer.size()) || !from_hex(signature_hex, signature, sizeof signature)) {
    return invalid_argument("unsigned record: signer or signature is not hex of the right size");
  }
  const std::string expected_tag = membership_tag(membership_key, signer);
  if (member_hex.size() != expected_tag.size() ||
      sodium_memcmp(member_hex.data(), expected_tag.data(), expected_tag.size()) != 0) {
    return permission_denied("forged record: its signer is not a member of this swarm");
  }
  const std::string message = signed_bytes(record, value);
  if (crypto_sign_verify_detached(signature, reinterpret_cast<const unsigned char*>(message.data()), message.size(),
                                  signer.data()) != 0) {
    return permission_denied("forged record: bad signature");
  }
  if (credentials.owner) SWARM_RETURN_IF_ERROR(certified(j, *credentials.owner, signer, now));
  SWARM_ASSIGN_OR_RETURN(std::string fingerprint, fingerprint_of_signing_key(signer));
  if (fingerprint_in(record.subkey) != fingerprint) {
    return permission_denied("forged record: subkey {} is not bound to its signer's key", record.subkey);
  }
  SWARM_RETURN_IF_ERROR(names_its_subkey(value, record.subkey));
  return value;
}

}  // namespace

RecordSealer make_record_sealer(const SwarmCredentials& credentials, std::function<int64_t()> wall_seconds) {
  if (!wall_seconds) wall_seconds = wall_clock_seconds;
  auto shared = std::make_shared<const SwarmCredentials>(credentials);
  RecordSealer sealer;
  sealer.seal = [shared](const StoredRecord& record) { return seal(*shared, record); };
  sealer.open = [shared, wall_seconds](const StoredRecord& record) { return open(*shared, record, wall_seconds()); };
  return sealer;
}

}  // namespace swarm::security
