#include "swarm/security/hop_chain.h"

#include <sodium.h>

#include <cstring>

namespace swarm::security {
namespace {

constexpr uint8_t kFormatVersion = 1;
constexpr std::string_view kDomain = "swarm hop chain v1";

void put_u64(std::string& out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}
void put_text(std::string& out, std::string_view text) {
  out.push_back(static_cast<char>(text.size()));  // callers keep it within kMaxHopIdBytes
  out.append(text);
}
template <size_t N>
void put_bytes(std::string& out, const std::array<unsigned char, N>& bytes) {
  out.append(reinterpret_cast<const char*>(bytes.data()), N);
}

// What link `index` signs: the start, its place, the link before's signature (none for the first), its ends.
std::string signed_message(const HopChain& chain, size_t index, std::string_view from, std::string_view to) {
  std::string message(kDomain);
  put_text(message, chain.trainer);
  put_u64(message, chain.start.microbatch);
  put_u64(message, chain.start.attempt);
  put_u64(message, static_cast<uint64_t>(chain.start.deadline_unix_ms));
  put_u64(message, index);
  if (index > 0) put_bytes(message, chain.links[index - 1].signature);
  put_text(message, from);
  put_text(message, to);
  return message;
}

HopLink sign_link(const HopChain& chain, const SwarmIdentity& signer, std::string_view from, std::string_view to) {
  HopLink link;
  link.from = std::string(from.substr(0, kMaxHopIdBytes));
  link.to = std::string(to.substr(0, kMaxHopIdBytes));
  link.from_key = signer.signing_public;
  const std::string message = signed_message(chain, chain.links.size(), link.from, link.to);
  crypto_sign_detached(link.signature.data(), nullptr, reinterpret_cast<const unsigned char*>(message.data()),
                       message.size(), signer.signing_secret.data());
  return link;
}

// Reads the wire form front to back; every read is checked against what is left.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : rest_(bytes) {}
  bool u8(uint8_t& value) {
    if (rest_.empty()) return false;
    value = static_cast<uint8_t>(rest_[0]);
    rest_.remove_prefix(1);
    return true;
  }
  bool u64(uint64_t& value) {
    if (rest_.size() < 8) return false;
    value = 0;
    for (int i = 0; i < 8; ++i) value |= uint64_t{static_cast<uint8_t>(rest_[i])} << (8 * i);
    rest_.remove_prefix(8);
    return true;
  }
  bool text(std::string& value) {
    uint8_t size = 0;
    if (!u8(size) || size == 0 || size > kMaxHopIdBytes || rest_.size() < size) return false;
    value.assign(rest_.substr(0, size));
    rest_.remove_prefix(size);
    return true;
  }
  template <size_t N>
  bool bytes(std::array<unsigned char, N>& value) {
    if (rest_.size() < N) return false;
    std::memcpy(value.data(), rest_.data(), N);
    rest_.remove_prefix(N);
    return true;
  }
  bool done() const { return rest_.empty(); }

 private:
  std::string_view rest_;
};

}  // namespace

HopChain start_hop_chain(const SwarmIdentity& trainer, std::string_view trainer_id, HopStart start,
                         std::string_view first_peer) {
  HopChain chain;
  chain.trainer = std::string(trainer_id.substr(0, kMaxHopIdBytes));
  chain.start = start;
  chain.links.push_back(sign_link(chain, trainer, chain.trainer, first_peer));
  return chain;
}

void extend_hop_chain(HopChain& chain, const SwarmIdentity& self, std::string_view self_id,
                      std::string_view next_peer) {
  chain.links.push_back(sign_link(chain, self, self_id, next_peer));
}

Status check_hop_chain(const HopChain& chain, std::string_view me, const PeerIdentity& sender, size_t max_links) {
  if (chain.links.empty()) return permission_denied("a hop chain without links");
  if (chain.links.size() > max_links) {
    return invalid_argument("a hop chain of {} links, beyond {}", chain.links.size(), max_links);
  }
  if (chain.links.front().from != chain.trainer) return permission_denied("the hop chain does not start at its trainer");
  for (size_t i = 0; i < chain.links.size(); ++i) {
    const HopLink& link = chain.links[i];
    auto fingerprint = fingerprint_of_signing_key(link.from_key);
    if (!fingerprint.is_ok() || fingerprint_in(link.from).empty() || *fingerprint != fingerprint_in(link.from)) {
      return permission_denied("hop link {}: {} is not bound to the key that signed it", i, link.from);
    }
    if (i > 0 && chain.links[i - 1].to != link.from) {
      return permission_denied("hop link {} starts at {}, but link {} ended at {}", i, link.from, i - 1,
                               chain.links[i - 1].to);
    }
    // Each link signs over the one before: the message needs the links up to i only.
    const std::string message = signed_message(chain, i, link.from, link.to);
    if (crypto_sign_verify_detached(link.signature.data(), reinterpret_cast<const unsigned char*>(message.data()),
                                    message.size(), link.from_key.data()) != 0) {
      return permission_denied("hop link {} ({} to {}) has a bad signature", i, link.from, link.to);
    }
  }
  if (chain.links.back().to != me) return permission_denied("the hop chain ends at {}, not here", chain.links.back().to);
  if (!speaks_for(chain.links.back().from, sender)) {
    return permission_denied("the sender is not {}, the chain's last signer", chain.links.back().from);
  }
  return Status::ok();
}

std::string hop_chain_bytes(const HopChain& chain) {
  std::string out;
  out.push_back(static_cast<char>(kFormatVersion));
  put_text(out, chain.trainer);
  put_u64(out, chain.start.microbatch);
  put_u64(out, chain.start.attempt);
  put_u64(out, static_cast<uint64_t>(chain.start.deadline_unix_ms));
  out.push_back(static_cast<char>(chain.links.size()));
  for (const HopLink& link : chain.links) {
    put_text(out, link.from);
    put_bytes(out, link.from_key);
    put_text(out, link.to);
    put_bytes(out, link.signature);
  }
  return out;
}

Result<HopChain> hop_chain_from_bytes(std::string_view bytes, size_t max_links) {
  Reader reader(bytes);
  HopChain chain;
  uint8_t version = 0, links = 0;
  uint64_t attempt = 0, deadline = 0;
  if (!reader.u8(version) || version != kFormatVersion) return invalid_argument("not a hop chain of version 1");
  if (!reader.text(chain.trainer) || !reader.u64(chain.start.microbatch) || !reader.u64(attempt) ||
      !reader.u64(deadline) || !reader.u8(links)) {
    return invalid_argument("a hop chain cut short in its start");
  }
  if (attempt > UINT32_MAX || deadline > static_cast<uint64_t>(INT64_MAX)) {
    return invalid_argument("a hop chain's attempt or deadline is out of range");
  }
  chain.start.attempt = static_cast<uint32_t>(attempt);
  chain.start.deadline_unix_ms = static_cast<int64_t>(deadline);
  if (links == 0 || links > max_links) return invalid_argument("a hop chain of {} links (1 to {})", links, max_links);
  chain.links.resize(links);
  for (HopLink& link : chain.links) {
    if (!reader.text(link.from) || !reader.bytes(link.from_key) || !reader.text(link.to) ||
        !reader.bytes(link.signature)) {
      return invalid_argument("a hop chain cut short in a link");
    }
  }
  if (!reader.done()) return invalid_argument("bytes after the hop chain's last link");
  return chain;
}

}  // namespace swarm::security
