#include "swarm/registry/dht_registry.h"

#include <atomic>
#include <functional>
#include <algorithm>
#include <bit>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <utility>

#include <netinet/in.h>

#include <opendht.h>

namespace swarm {
namespace {

// One DHT value: the record plus the announcement's sequence number, which
// orders announcements of one subkey so the newest wins wherever copies of
// older ones linger (storage nodes that missed the replacement, say).
struct Packed {
  uint64_t seq = 0;
  double expires_at = 0.0;
  std::string subkey;
  std::string value;
};

// Length-prefixed little-endian fields after a magic and version, so a value
// of another type or version under the same key is ignored, not misread. The
// value stays opaque bytes (JSON text would reject non-UTF-8 values).
constexpr char kMagic[4] = {'S', 'W', 'R', '1'};

void put_u64(dht::Blob& out, uint64_t x) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(x >> (8 * i)));
}
void put_u32(dht::Blob& out, uint32_t x) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(x >> (8 * i)));
}

dht::Blob pack(const Packed& p) {
  dht::Blob out;
  out.reserve(sizeof(kMagic) + 8 + 8 + 4 + p.subkey.size() + 4 + p.value.size());
  out.insert(out.end(), kMagic, kMagic + sizeof(kMagic));
  put_u64(out, p.seq);
  put_u64(out, std::bit_cast<uint64_t>(p.expires_at));
  put_u32(out, static_cast<uint32_t>(p.subkey.size()));
  out.insert(out.end(), p.subkey.begin(), p.subkey.end());
  put_u32(out, static_cast<uint32_t>(p.value.size()));
  out.insert(out.end(), p.value.begin(), p.value.end());
  return out;
}

class Reader {
 public:
  explicit Reader(const dht::Blob& data) : data_(data) {}
  bool bytes(size_t n, const uint8_t** at) {
    if (data_.size() - pos_ < n) return false;
    *at = data_.data() + pos_;
    pos_ += n;
    return true;
  }
  bool u64(uint64_t* x) {
    const uint8_t* at;
    if (!bytes(8, &at)) return false;
    *x = 0;
    for (int i = 0; i < 8; ++i) *x |= uint64_t{at[i]} << (8 * i);
    return true;
  }
  bool str(std::string* s) {
    uint64_t n = 0;
    const uint8_t* at;
    if (!bytes(4, &at)) return false;
    for (int i = 0; i < 4; ++i) n |= uint64_t{at[i]} << (8 * i);
    if (!bytes(n, &at)) return false;
    s->assign(reinterpret_cast<const char*>(at), n);
    return true;
  }
  bool at_end() const { return pos_ == data_.size(); }

 private:
  const dht::Blob& data_;
  size_t pos_ = 0;
};

// Anyone can put anything under any key, so every received value is parsed
// defensively and dropped when malformed.
std::optional<Packed> unpack(const dht::Blob& data) {
  Reader in(data);
  const uint8_t* magic;
  Packed p;
  uint64_t expires_bits = 0;
  if (!in.bytes(sizeof(kMagic), &magic) || std::memcmp(magic, kMagic, sizeof(kMagic)) != 0 ||
      !in.u64(&p.seq) || !in.u64(&expires_bits) || !in.str(&p.subkey) || !in.str(&p.value) ||
      !in.at_end()) {
    return std::nullopt;
  }
  p.expires_at = std::bit_cast<double>(expires_bits);
  return p;
}

// The subkey picks the DHT value id, so a re-announcement overwrites the same
// slot on the storage nodes instead of piling up beside the old one.
constexpr dht::ValueType::Id kRecordTypeId = 0x5357;
constexpr size_t kMaxValuesPerGet = 4096;

dht::Value::Id value_id(const std::string& subkey) {
  dht::InfoHash h = dht::InfoHash::get("swarm/registry/subkey/" + subkey);
  uint64_t id = 0;
  std::memcpy(&id, h.data(), sizeof(id));
  return id == dht::Value::INVALID_ID ? 1 : id;
}

// OpenDHT refuses by default to overwrite a stored unsigned value with one of
// the same id; this type allows it when the newcomer is the newer announcement,
// so an old copy cannot be replayed over a fresh one. `admissible` is the
// node's own check of a value (its timestamps, and its seal in a secured swarm),
// so a node stores nothing it would refuse to read.
using Admissible = std::function<bool(const dht::InfoHash&, const Packed&)>;

dht::ValueType make_record_type(Admissible admissible) {
  return dht::ValueType(
      kRecordTypeId, "swarm registry record",
      std::chrono::seconds(static_cast<int64_t>(DhtRegistry::kDhtLifetimeSeconds)),
      [admissible](dht::InfoHash key, std::shared_ptr<dht::Value>& value, const dht::InfoHash& from,
                   const dht::SockAddr& addr) {
        if (!dht::ValueType::DEFAULT_STORE_POLICY(key, value, from, addr)) return false;
        auto packed = unpack(value->data);
        return packed.has_value() && admissible(key, *packed);
      },
      [admissible](dht::InfoHash key, const std::shared_ptr<dht::Value>& old_value,
                   std::shared_ptr<dht::Value>& new_value, const dht::InfoHash&, const dht::SockAddr&) {
        auto fresh = unpack(new_value->data);
        if (!fresh || new_value->size() > dht::MAX_VALUE_SIZE || !admissible(key, *fresh)) return false;
        auto stored = unpack(old_value->data);
        return !stored || fresh->seq >= stored->seq;
      });
}

StoredRecord stored_record(const dht::InfoHash& key, const Packed& p) {
  return StoredRecord{key.toString(), p.subkey, p.seq, p.expires_at, p.value};
}

Result<dht::SockAddr> parse_ipv4(const std::string& host, uint16_t port) {
  try {
    dht::SockAddr addr;
    addr.setFamily(AF_INET);
    addr.setAddress(host.c_str());
    addr.setPort(port);
    return addr;
  } catch (const std::exception& e) {
    return invalid_argument("'{}' is not a numeric IPv4 address: {}", host, e.what());
  }
}

Result<dht::SockAddr> parse_host_port(const std::string& text) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 == text.size()) {
    return invalid_argument("bootstrap node '{}' is not host:port", text);
  }
  unsigned long port = 0;
  try {
    size_t used = 0;
    port = std::stoul(text.substr(colon + 1), &used);
    if (used != text.size() - colon - 1) throw std::invalid_argument("trailing characters");
  } catch (const std::exception&) {
    return invalid_argument("bootstrap node '{}' has a bad port", text);
  }
  if (port == 0 || port > 65535) return invalid_argument("bootstrap node '{}': port out of range", text);
  return parse_ipv4(text.substr(0, colon), static_cast<uint16_t>(port));
}

}  // namespace

struct DhtRegistry::Impl {
  DhtRegistryOptions options;
  // Declared before the runner: its threads report status changes here until joined.
  std::mutex status_mutex;
  std::condition_variable status_changed;
  dht::NodeStatus status = dht::NodeStatus::Disconnected;
  dht::DhtRunner runner;
  std::mutex seq_mutex;
  uint64_t last_seq = 0;
  std::atomic<uint64_t> untimely{0};
  std::atomic<uint64_t> refused_seals{0};

  // A value's timestamps must be plausible: a sequence (wall-clock ns) from the
  // future would outrank every honest re-announcement, and an expiry beyond the
  // DHT's own lifetime would outlive its announcer.
  bool timely(const Packed& p) {
    const double now = DhtRegistry::system_seconds();
    const double skew = options.max_clock_skew_seconds;
    const bool ok = static_cast<double>(p.seq) <= (now + skew) * 1e9 &&
                    p.expires_at <= now + DhtRegistry::kDhtLifetimeSeconds + skew;
    if (!ok) untimely.fetch_add(1, std::memory_order_relaxed);
    return ok;
  }
  // The announced value, or nothing when the value is refused (and counted).
  std::optional<std::string> open(const dht::InfoHash& key, const Packed& p) {
    if (!timely(p)) return std::nullopt;
    if (!options.sealer) return p.value;
    auto opened = options.sealer.open(stored_record(key, p));
    if (!opened.is_ok()) {
      refused_seals.fetch_add(1, std::memory_order_relaxed);
      return std::nullopt;
    }
    return std::move(opened).value();
  }

  // Wall-clock nanoseconds, forced upward so two announcements from this node
  // within one clock tick (or across a clock step back) still order correctly.
  uint64_t next_seq() {
    auto ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
    std::lock_guard lock(seq_mutex);
    last_seq = std::max(last_seq + 1, ns);
    return last_seq;
  }
};

DhtRegistry::DhtRegistry(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DhtRegistry::DhtRegistry(DhtRegistry&&) noexcept = default;
DhtRegistry& DhtRegistry::operator=(DhtRegistry&& other) noexcept {
  if (this != &other) {
    if (impl_) impl_->runner.join();
    impl_ = std::move(other.impl_);
  }
  return *this;
}

DhtRegistry::~DhtRegistry() {
  if (!impl_) return;
  try {
    impl_->runner.join();
  } catch (...) {
    // Nothing useful to do in a destructor; the threads are gone either way.
  }
}

double DhtRegistry::system_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double DhtRegistry::now() const { return system_seconds(); }

Result<DhtRegistry> DhtRegistry::start(uint16_t port, std::vector<std::string> bootstrap_nodes,
                                       DhtRegistryOptions options) {
  std::vector<dht::SockAddr> peers;
  for (const auto& node : bootstrap_nodes) {
    SWARM_ASSIGN_OR_RETURN(dht::SockAddr addr, parse_host_port(node));
    peers.push_back(std::move(addr));
  }
  SWARM_ASSIGN_OR_RETURN(dht::SockAddr bind4, parse_ipv4(options.bind_address, port));

  auto impl = std::make_unique<Impl>();
  impl->options = options;
  try {
    dht::DhtRunner::Config config;
    config.threaded = true;
    config.peer_discovery = false;  // multicast discovery would find unrelated local nodes
    config.peer_publish = false;
    config.dht_config.node_config.network = options.network_id;
    if (!options.per_address_rate_limit) config.dht_config.node_config.max_peer_req_per_sec = -1;
    config.bind4 = bind4;
    dht::DhtRunner::Context context;
    context.statusChangedCallback = [state = impl.get()](dht::NodeStatus v4, dht::NodeStatus v6) {
      {
        std::lock_guard lock(state->status_mutex);
        state->status = std::max(v4, v6);
      }
      state->status_changed.notify_all();
    };
    impl->runner.run(config, std::move(context));
    // The runner keeps its types in the node run() creates; register before
    // bootstrapping so no record arrives under the default no-edit policy.
    impl->runner.registerType(
        make_record_type([state = impl.get()](const dht::InfoHash& key, const Packed& p) {
          return state->open(key, p).has_value();
        }));
    if (impl->runner.getBoundPort(AF_INET) == 0) {
      impl->runner.join();
      return unavailable("OpenDHT could not bind {}:{}", options.bind_address, port);
    }
    if (!peers.empty()) impl->runner.bootstrap(std::move(peers));
  } catch (const std::exception& e) {
    try {
      impl->runner.join();
    } catch (...) {
    }
    return unavailable("starting OpenDHT on {}:{}: {}", options.bind_address, port, e.what());
  }
  return DhtRegistry(std::move(impl));
}

bool DhtRegistry::connected() const {
  std::lock_guard lock(impl_->status_mutex);
  return impl_->status == dht::NodeStatus::Connected;
}

Status DhtRegistry::wait_connected(std::chrono::milliseconds within) {
  std::unique_lock lock(impl_->status_mutex);
  if (impl_->status_changed.wait_for(lock, within,
                                     [&] { return impl_->status == dht::NodeStatus::Connected; })) {
    return Status::ok();
  }
  return deadline_exceeded("DHT node on port {} found no responsive peer within {} ms", port(),
                           within.count());
}

uint64_t DhtRegistry::untimely_records() const { return impl_->untimely.load(); }
uint64_t DhtRegistry::refused_seals() const { return impl_->refused_seals.load(); }

uint16_t DhtRegistry::port() const { return impl_->runner.getBoundPort(AF_INET); }

Status DhtRegistry::put(const std::string& key, const std::string& subkey, std::string value,
                        double expires_at) {
  const dht::InfoHash hash = dht::InfoHash::get(key);
  Packed packed{impl_->next_seq(), expires_at, subkey, std::move(value)};
  if (impl_->options.sealer) {
    SWARM_ASSIGN_OR_RETURN(packed.value, impl_->options.sealer.seal(stored_record(hash, packed)));
  }
  dht::Blob data = pack(packed);
  if (data.size() > dht::MAX_VALUE_SIZE) {
    return invalid_argument("registry record of {} bytes exceeds OpenDHT's {} byte limit",
                            data.size(), dht::MAX_VALUE_SIZE);
  }
  try {
    auto v = std::make_shared<dht::Value>(kRecordTypeId, std::move(data), value_id(subkey));
    impl_->runner.put(hash, std::move(v), dht::DoneCallbackSimple{},
                      dht::time_point::max(), /*permanent=*/false);
  } catch (const std::exception& e) {
    return internal("OpenDHT put of '{}'/'{}': {}", key, subkey, e.what());
  }
  return Status::ok();
}

Status DhtRegistry::announce(const std::string& key, const std::string& subkey, std::string value,
                             double expires_at) {
  return put(key, subkey, std::move(value), expires_at);
}

Status DhtRegistry::withdraw(const std::string& key, const std::string& subkey) {
  // Expired at the epoch: newer than the record it hides, yet never live.
  return put(key, subkey, std::string(), 0.0);
}

Result<std::vector<Record>> DhtRegistry::get(const std::string& key) {
  // Shared with the callbacks, which may still fire after a timed-out get returns.
  struct Pending {
    std::mutex mutex;
    std::condition_variable changed;
    std::vector<std::shared_ptr<dht::Value>> values;
    bool done = false;
    bool ok = false;
  };
  auto pending = std::make_shared<Pending>();
  auto deadline = std::chrono::steady_clock::now() + impl_->options.get_timeout;
  const dht::InfoHash hash = dht::InfoHash::get(key);
  try {
    impl_->runner.get(
        hash,
        dht::GetCallback([pending](const std::vector<std::shared_ptr<dht::Value>>& values) {
          // Anyone may flood a key: what one get holds is bounded, and it stops there.
          std::lock_guard lock(pending->mutex);
          const size_t room = kMaxValuesPerGet - std::min(kMaxValuesPerGet, pending->values.size());
          pending->values.insert(pending->values.end(), values.begin(),
                                 values.begin() + static_cast<std::ptrdiff_t>(std::min(room, values.size())));
          return pending->values.size() < kMaxValuesPerGet;
        }),
        dht::DoneCallbackSimple([pending](bool ok) {
          {
            std::lock_guard lock(pending->mutex);
            pending->done = true;
            pending->ok = ok;
          }
          pending->changed.notify_all();
        }),
        dht::Value::TypeFilter(kRecordTypeId));
  } catch (const std::exception& e) {
    return internal("OpenDHT get of '{}': {}", key, e.what());
  }

  std::vector<std::shared_ptr<dht::Value>> values;
  bool done = false, ok = false;
  {
    std::unique_lock lock(pending->mutex);
    pending->changed.wait_until(lock, deadline, [&] { return pending->done; });
    values = pending->values;
    done = pending->done;
    ok = pending->ok;
  }
  if (values.empty() && !ok) {
    if (!done) return deadline_exceeded("OpenDHT get of '{}' timed out", key);
    return unavailable("OpenDHT get of '{}' reached no node", key);
  }

  // Newest per subkey first, expiry second: a withdrawal's tombstone must hide
  // the older live copy it replaces.
  std::map<std::string, Packed> newest;
  for (const auto& v : values) {
    if (!v) continue;
    auto p = unpack(v->data);
    if (!p) continue;
    auto opened = impl_->open(hash, *p);
    if (!opened) continue;
    p->value = std::move(*opened);
    auto [it, inserted] = newest.try_emplace(p->subkey, *p);
    if (!inserted && (p->seq > it->second.seq ||
                      (p->seq == it->second.seq && p->expires_at > it->second.expires_at))) {
      it->second = std::move(*p);
    }
  }
  double t = now();
  std::vector<Record> records;
  for (auto& [subkey, p] : newest) {
    if (p.expires_at <= t) continue;
    records.push_back(Record{key, subkey, std::move(p.value), p.expires_at});
  }
  return records;
}

}  // namespace swarm
