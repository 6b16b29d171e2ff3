#include "transports/netem/access_links.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>

namespace swarm::netem {
namespace {

constexpr uint64_t kBoardMagic = 0x53574d4c494e4b31ull;  // "SWMLINK1"
// Past this one message's transmission is capped; no real link takes this long.
constexpr double kMaxSeconds = 1e6;
// A queue longer than this (ns) is a corrupt board, not traffic.
constexpr int64_t kMaxQueueNs = int64_t{1'000'000} * 1'000'000'000;

static_assert(std::atomic<int64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "the board's atomics must work across processes");

int64_t now_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
Clock::time_point from_ns(int64_t ns) {
  return Clock::time_point(std::chrono::duration_cast<Duration>(std::chrono::nanoseconds(ns)));
}

std::string bounded_text(const char* text, size_t capacity) {
  return std::string(text, strnlen(text, capacity));
}

}  // namespace

struct AccessLinkBoard::Layout {
  enum : uint32_t { kFree = 0, kClaiming = 1, kReady = 2 };
  struct Address {
    std::atomic<uint32_t> state;
    char text[kMaxAddressBytes + 1];
  };
  struct Slot {
    std::atomic<uint32_t> state;
    char name[kMaxNameBytes + 1];
    double bandwidth_bytes_per_s;
    int64_t latency_ns;
    std::atomic<int64_t> busy_until_ns[2];  // up, down
    std::atomic<uint64_t> carried[2];
    Address addresses[kMaxAddresses];
  };
  std::atomic<uint64_t> magic;
  uint32_t slot_count;
  Slot slots[kMaxSlots];
};

Status AccessLinkSpec::validate() const {
  if (!(bandwidth_bytes_per_s >= 0) || std::isinf(bandwidth_bytes_per_s)) {
    return invalid_argument("an access link's bandwidth must be finite and >= 0, got {}", bandwidth_bytes_per_s);
  }
  if (latency < Duration::zero() || latency > std::chrono::hours(1)) {
    return invalid_argument("an access link's latency must be between 0 and an hour");
  }
  return Status::ok();
}

Result<std::shared_ptr<AccessLinkBoard>> AccessLinkBoard::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return unavailable("cannot open the link board {}: {}", path, std::strerror(errno));
  struct stat info {};
  const size_t bytes = sizeof(Layout);
  Status status = Status::ok();
  if (::fstat(fd, &info) != 0) {
    status = unavailable("cannot stat the link board {}: {}", path, std::strerror(errno));
  } else if (info.st_size == 0) {
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      status = unavailable("cannot size the link board {}: {}", path, std::strerror(errno));
    }
  } else if (static_cast<size_t>(info.st_size) != bytes) {
    status = invalid_argument("{} is no link board: {} bytes, not {}", path, info.st_size, bytes);
  }
  void* mapped = MAP_FAILED;
  if (status.is_ok()) mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  SWARM_RETURN_IF_ERROR(status);
  if (mapped == MAP_FAILED) return unavailable("cannot map the link board {}: {}", path, std::strerror(errno));
  auto* layout = static_cast<Layout*>(mapped);
  // A new file is zeroes: the first process to get here stamps it.
  uint64_t expected = 0;
  if (!layout->magic.compare_exchange_strong(expected, kBoardMagic) && expected != kBoardMagic) {
    ::munmap(mapped, bytes);
    return invalid_argument("{} is no link board (wrong magic)", path);
  }
  return std::shared_ptr<AccessLinkBoard>(new AccessLinkBoard(layout, bytes));
}

Result<std::shared_ptr<AccessLinkBoard>> AccessLinkBoard::private_board() {
  const size_t bytes = sizeof(Layout);
  void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) return unavailable("cannot map a link board: {}", std::strerror(errno));
  static_cast<Layout*>(mapped)->magic.store(kBoardMagic);
  return std::shared_ptr<AccessLinkBoard>(new AccessLinkBoard(static_cast<Layout*>(mapped), bytes));
}

AccessLinkBoard::~AccessLinkBoard() { ::munmap(layout_, bytes_); }

Result<AccessLink> AccessLinkBoard::join(std::string_view name, AccessLinkSpec spec) {
  SWARM_RETURN_IF_ERROR(spec.validate());
  if (name.empty() || name.size() > kMaxNameBytes) {
    return invalid_argument("an access link's name must be 1 to {} bytes", kMaxNameBytes);
  }
  for (int i = 0; i < kMaxSlots; ++i) {
    Layout::Slot& slot = layout_->slots[i];
    uint32_t expected = Layout::kFree;
    if (!slot.state.compare_exchange_strong(expected, Layout::kClaiming)) continue;
    std::memset(slot.name, 0, sizeof(slot.name));
    std::memcpy(slot.name, name.data(), name.size());
    slot.bandwidth_bytes_per_s = spec.bandwidth_bytes_per_s;
    slot.latency_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(spec.latency).count();
    for (int d = 0; d < 2; ++d) {
      slot.busy_until_ns[d].store(0);
      slot.carried[d].store(0);
    }
    slot.state.store(Layout::kReady, std::memory_order_release);
    return AccessLink(shared_from_this(), i);
  }
  return resource_exhausted("the link board has no free slot of {}", kMaxSlots);
}

Status AccessLinkBoard::add_address(int slot, std::string_view address) {
  if (slot < 0 || slot >= kMaxSlots) return invalid_argument("no slot {}", slot);
  if (address.empty() || address.size() > kMaxAddressBytes) {
    return invalid_argument("an address on the link board must be 1 to {} bytes", kMaxAddressBytes);
  }
  for (Layout::Address& entry : layout_->slots[slot].addresses) {
    uint32_t expected = Layout::kFree;
    if (!entry.state.compare_exchange_strong(expected, Layout::kClaiming)) continue;
    std::memset(entry.text, 0, sizeof(entry.text));
    std::memcpy(entry.text, address.data(), address.size());
    entry.state.store(Layout::kReady, std::memory_order_release);
    return Status::ok();
  }
  return resource_exhausted("slot {} already serves {} addresses", slot, kMaxAddresses);
}

Status AccessLink::add_address(std::string_view address) const {
  if (!board_) return failed_precondition("no access link");
  return board_->add_address(slot_, address);
}

std::optional<int> AccessLinkBoard::slot_of(std::string_view address) const {
  for (int i = 0; i < kMaxSlots; ++i) {
    const Layout::Slot& slot = layout_->slots[i];
    if (slot.state.load(std::memory_order_acquire) != Layout::kReady) continue;
    for (const Layout::Address& entry : slot.addresses) {
      if (entry.state.load(std::memory_order_acquire) != Layout::kReady) continue;
      if (bounded_text(entry.text, sizeof(entry.text)) == address) return i;
    }
  }
  return std::nullopt;
}

std::string AccessLinkBoard::name_of(int slot) const {
  if (slot < 0 || slot >= kMaxSlots) return {};
  const Layout::Slot& s = layout_->slots[slot];
  if (s.state.load(std::memory_order_acquire) != Layout::kReady) return {};
  return bounded_text(s.name, sizeof(s.name));
}

std::vector<int> AccessLinkBoard::joined() const {
  std::vector<int> slots;
  for (int i = 0; i < kMaxSlots; ++i) {
    if (layout_->slots[i].state.load(std::memory_order_acquire) == Layout::kReady) slots.push_back(i);
  }
  return slots;
}

uint64_t AccessLinkBoard::bytes_carried(int slot, Direction direction) const {
  if (slot < 0 || slot >= kMaxSlots) return 0;
  return layout_->slots[slot].carried[direction == Direction::up ? 0 : 1].load();
}

Clock::time_point AccessLinkBoard::transmit(int slot, Direction direction, Clock::time_point ready, uint64_t bytes) {
  if (slot < 0 || slot >= kMaxSlots) return ready;
  Layout::Slot& s = layout_->slots[slot];
  if (s.state.load(std::memory_order_acquire) != Layout::kReady) return ready;
  const int d = direction == Direction::up ? 0 : 1;
  s.carried[d].fetch_add(bytes, std::memory_order_relaxed);
  // Another process wrote the rate: a value that is not a positive finite number is no limit.
  const double rate = s.bandwidth_bytes_per_s;
  if (!(rate > 0) || std::isinf(rate)) return ready;
  const double seconds = std::min(static_cast<double>(bytes) / rate, kMaxSeconds);
  const auto transmission = static_cast<int64_t>(seconds * 1e9);
  const int64_t ready_ns = now_ns(ready);
  int64_t busy = s.busy_until_ns[d].load();
  int64_t done = 0;
  do {
    // Another process wrote `busy`: a time beyond any real queue (or negative) counts as
    // none, and the sum saturates instead of overflowing.
    const int64_t start = busy > ready_ns && busy - ready_ns <= kMaxQueueNs ? busy : ready_ns;
    done = start > INT64_MAX - transmission ? INT64_MAX : start + transmission;
  } while (!s.busy_until_ns[d].compare_exchange_weak(busy, done));
  return from_ns(done);
}

Clock::time_point AccessLinkBoard::deliver(std::optional<int> from, std::optional<int> to, Clock::time_point now,
                                           uint64_t bytes) {
  const auto latency_of = [&](std::optional<int> slot) -> int64_t {
    if (!slot || *slot < 0 || *slot >= kMaxSlots) return 0;
    const int64_t ns = layout_->slots[*slot].latency_ns;
    return std::clamp<int64_t>(ns, 0, int64_t{3600} * 1'000'000'000);
  };
  Clock::time_point t = now;
  if (from) t = transmit(*from, Direction::up, t, bytes);
  if (to) t = transmit(*to, Direction::down, t, bytes);
  return t + std::chrono::nanoseconds(std::max(latency_of(from), latency_of(to)));
}

namespace {
std::mutex process_link_mu;
std::optional<AccessLink> process_link;
}  // namespace

void set_process_access_link(std::optional<AccessLink> link) {
  std::lock_guard lock(process_link_mu);
  process_link = std::move(link);
}

std::optional<AccessLink> process_access_link() {
  std::lock_guard lock(process_link_mu);
  return process_link;
}

Result<AccessLinkSpec> parse_access_link(std::string_view text) {
  SWARM_ASSIGN_OR_RETURN(const EmulatedLink link, parse_link(text));
  return AccessLinkSpec{.bandwidth_bytes_per_s = link.bandwidth_bytes_per_s, .latency = link.latency};
}

}  // namespace swarm::netem
