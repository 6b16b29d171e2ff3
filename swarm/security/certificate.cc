#include "swarm/security/certificate.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

namespace swarm::security {
namespace {

constexpr std::string_view kCertificateTag = "swarm-certificate-v1";

// The signed fields, in one unambiguous encoding (the text before the signature).
std::string signed_text(const Certificate& c) {
  return fmt::format("{} {} {} {}", kCertificateTag, to_hex(c.member.data(), c.member.size()), role_name(c.role),
                     c.expires_at);
}

std::vector<std::string_view> words_of(std::string_view text) {
  std::vector<std::string_view> words;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find(' ', at), text.size());
    words.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return words;
}

Result<int64_t> seconds_from_text(std::string_view text) {
  if (text.empty() || text.size() > 18) return invalid_argument("certificate: expiry '{}' is not a number", text);
  int64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return invalid_argument("certificate: expiry '{}' is not a number", text);
    value = value * 10 + (c - '0');
  }
  return value;
}

Result<std::string> read_small_file(const std::string& path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot read {}: {}", path, std::strerror(errno));
  std::string text(limit + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > limit) return invalid_argument("{}: longer than {} bytes", path, limit);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace

const char* role_name(MemberRole role) { return role == MemberRole::peer ? "peer" : "trainer"; }

Result<MemberRole> role_from_name(std::string_view name) {
  if (name == "peer") return MemberRole::peer;
  if (name == "trainer") return MemberRole::trainer;
  return invalid_argument("unknown role '{}': peer or trainer", name);
}

Certificate admit(const SwarmIdentity& owner, const SigningKey& member, MemberRole role, int64_t expires_at) {
  Certificate c{member, role, expires_at, {}};
  const std::string message = signed_text(c);
  crypto_sign_detached(c.signature.data(), nullptr, reinterpret_cast<const unsigned char*>(message.data()),
                       message.size(), owner.signing_secret.data());
  return c;
}

std::string to_text(const Certificate& c) {
  return signed_text(c) + " " + to_hex(c.signature.data(), c.signature.size());
}

Result<Certificate> certificate_from_text(std::string_view text) {
  if (text.size() > kMaxCertificateChars) return invalid_argument("certificate of {} characters", text.size());
  const auto words = words_of(text);
  if (words.size() != 5 || words[0] != kCertificateTag) {
    return invalid_argument("not a certificate: expected '{} MEMBER ROLE EXPIRY SIGNATURE'", kCertificateTag);
  }
  Certificate c;
  if (!from_hex(words[1], c.member.data(), c.member.size())) {
    return invalid_argument("certificate: the member key is not 64 hex digits");
  }
  SWARM_ASSIGN_OR_RETURN(c.role, role_from_name(words[2]));
  SWARM_ASSIGN_OR_RETURN(c.expires_at, seconds_from_text(words[3]));
  if (!from_hex(words[4], c.signature.data(), c.signature.size())) {
    return invalid_argument("certificate: the signature is not 128 hex digits");
  }
  return c;
}

Status check_certificate(const Certificate& c, const SigningKey& owner, const SigningKey& member, int64_t now) {
  if (sodium_memcmp(c.member.data(), member.data(), member.size()) != 0) {
    return permission_denied("the certificate admits another key");
  }
  const std::string message = signed_text(c);
  if (crypto_sign_verify_detached(c.signature.data(), reinterpret_cast<const unsigned char*>(message.data()),
                                  message.size(), owner.data()) != 0) {
    return permission_denied("the certificate is not signed by this swarm's owner");
  }
  if (now >= c.expires_at) return permission_denied("the certificate expired at {} (now {})", c.expires_at, now);
  return Status::ok();
}

Status check_caller(const SigningKey& owner, const PeerIdentity& sender, std::string_view certificate_text,
                    int64_t now) {
  if (certificate_text.empty()) {
    return permission_denied("uncertified caller: this swarm has an owner and the request carries no certificate");
  }
  auto certificate = certificate_from_text(certificate_text);
  if (!certificate.is_ok()) return permission_denied("uncertified caller: {}", certificate.status().message());
  // The certificate names an Ed25519 key; the transport authenticated its CURVE conversion.
  auto admitted = fingerprint_of_signing_key(certificate->member);
  if (!admitted.is_ok() || !speaks_for("caller." + *admitted, sender)) {
    return permission_denied("uncertified caller: the certificate admits another key than the one that called");
  }
  Status valid = check_certificate(*certificate, owner, certificate->member, now);
  if (!valid.is_ok()) return permission_denied("uncertified caller: {}", valid.message());
  return Status::ok();
}

Result<SwarmIdentity> create_key_file(const std::string& path) {
  if (sodium_init() < 0) return internal("libsodium failed to initialize");
  std::array<unsigned char, 32> seed{};
  randombytes_buf(seed.data(), seed.size());
  const std::string text = to_hex(seed.data(), seed.size()) + "\n";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    sodium_memzero(seed.data(), seed.size());
    return failed_precondition("cannot create key file {}: {}", path, std::strerror(errno));
  }
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const bool closed = ::close(fd) == 0;
  auto identity = identity_from_seed(seed);
  sodium_memzero(seed.data(), seed.size());
  if (!written || !closed) return internal("cannot write key file {}", path);
  return identity;
}

Result<SwarmIdentity> load_key_file(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return not_found("no key file {}: {}", path, std::strerror(errno));
  if ((info.st_mode & 077) != 0) {
    return permission_denied("key file {} may be read by others (mode {:o}): chmod 600 it", path, info.st_mode & 0777);
  }
  SWARM_ASSIGN_OR_RETURN(std::string text, read_small_file(path, 256));
  std::array<unsigned char, 32> seed{};
  if (!from_hex(text, seed.data(), seed.size())) return invalid_argument("key file {}: not 64 hex digits", path);
  auto identity = identity_from_seed(seed);
  sodium_memzero(seed.data(), seed.size());
  return identity;
}

Result<SwarmCredentials> join_swarm_as(const std::string& secret, const Membership& membership, int64_t now) {
  SWARM_ASSIGN_OR_RETURN(SwarmCredentials credentials, join_swarm(secret));
  credentials.self = membership.identity;
  if (!membership.owner) {
    if (membership.certificate) return invalid_argument("a certificate without the owner's key (--owner-key)");
    return credentials;
  }
  credentials.owner = membership.owner;
  if (!membership.certificate) return credentials;  // reads the swarm's records, announces none that count
  Status admitted = check_certificate(*membership.certificate, *membership.owner, membership.identity.signing_public, now);
  if (!admitted.is_ok()) return permission_denied("this process's certificate: {}", admitted.message());
  credentials.certificate = to_text(*membership.certificate);
  return credentials;
}

int64_t wall_clock_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Result<SigningKey> signing_key_from_hex(std::string_view hex) {
  SigningKey key{};
  if (!from_hex(hex, key.data(), key.size())) return invalid_argument("a public key is 64 hex digits, not '{}'", hex);
  return key;
}

Result<Certificate> load_certificate_file(const std::string& path) {
  SWARM_ASSIGN_OR_RETURN(std::string text, read_small_file(path, kMaxCertificateChars));
  auto certificate = certificate_from_text(text);
  if (!certificate.is_ok()) return invalid_argument("{}: {}", path, certificate.status().message());
  return certificate;
}

}  // namespace swarm::security
