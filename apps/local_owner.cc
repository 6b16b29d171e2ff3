#include "apps/local_owner.h"

#include <filesystem>
#include <fstream>

namespace swarm::apps {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kCertificateSeconds = 24 * 3600;

}  // namespace

Result<LocalOwner> LocalOwner::create(const std::string& keys_dir) {
  std::error_code error;
  fs::create_directories(keys_dir, error);
  if (error) return permission_denied("cannot create {}: {}", keys_dir, error.message());
  const std::string path = (fs::path(keys_dir) / "owner.key").string();
  LocalOwner owner;
  owner.keys_dir_ = keys_dir;
  if (fs::exists(path)) {
    SWARM_ASSIGN_OR_RETURN(owner.owner_, security::load_key_file(path));
  } else {
    SWARM_ASSIGN_OR_RETURN(owner.owner_, security::create_key_file(path));
  }
  return owner;
}

std::string LocalOwner::public_hex() const {
  return security::to_hex(owner_.signing_public.data(), owner_.signing_public.size());
}

Result<MembershipOptions> LocalOwner::admit(const std::string& name, security::MemberRole role) const {
  const std::string key_path = (fs::path(keys_dir_) / (name + ".key")).string();
  const std::string certificate_path = (fs::path(keys_dir_) / (name + ".cert")).string();
  auto member = fs::exists(key_path) ? security::load_key_file(key_path) : security::create_key_file(key_path);
  if (!member.is_ok()) return member.status();
  const security::Certificate certificate =
      security::admit(owner_, member->signing_public, role, security::wall_clock_seconds() + kCertificateSeconds);
  std::ofstream out(certificate_path, std::ios::trunc);
  if (!(out << security::to_text(certificate) << "\n") || !out.flush()) {
    return permission_denied("cannot write {}", certificate_path);
  }
  return MembershipOptions{public_hex(), key_path, certificate_path};
}

}  // namespace swarm::apps
