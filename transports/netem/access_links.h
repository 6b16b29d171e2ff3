// access_links: each process's own link to the network, shared by everything it
// sends and receives, as a home machine's uplink is. A message from A to B
// queues behind everything else A is sending and then behind everything else B
// is receiving, whichever of A's connections carries it. NetemTransport's
// per-connection LinkModel cannot say that: two connections of one trainer
// would each get the whole bandwidth.
//
// The links of one emulated network live in a board: a small file every
// process maps, one slot per process, holding the link's rates and the times
// its two directions are busy until (steady_clock, which every process of one
// machine shares). Reservations are lock-free, so processes never wait on each
// other's locks; the board holds no messages, only times.
//
//   auto board = netem::AccessLinkBoard::open("/run/links.board").value();   // created if absent
//   netem::AccessLink trainer = board->join("trainer", {.bandwidth_bytes_per_s = 25e6, .latency = 50ms}).value();
//   netem::set_process_access_link(trainer);   // every NetemTransport client and server of this process
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "swarm/core/status.h"
#include "transports/netem/link_model.h"

namespace swarm::netem {

struct AccessLinkSpec {
  double bandwidth_bytes_per_s = 0;  // each way; 0 = unlimited
  Duration latency{0};               // one way, to any other process of the board
  Status validate() const;
};

class AccessLinkBoard;

// One process's slot on a board; copies refer to the same link.
class AccessLink {
 public:
  AccessLink() = default;
  bool valid() const { return board_ != nullptr; }
  int slot() const { return slot_; }
  const std::shared_ptr<AccessLinkBoard>& board() const { return board_; }
  // Registers an address this process serves at, so that clients elsewhere on
  // the board find this link behind it. At most kMaxAddresses; more are refused.
  Status add_address(std::string_view address) const;

 private:
  friend class AccessLinkBoard;
  AccessLink(std::shared_ptr<AccessLinkBoard> board, int slot) : board_(std::move(board)), slot_(slot) {}
  std::shared_ptr<AccessLinkBoard> board_;
  int slot_ = -1;
};

class AccessLinkBoard : public std::enable_shared_from_this<AccessLinkBoard> {
 public:
  static constexpr int kMaxSlots = 64;
  static constexpr int kMaxAddresses = 4;
  static constexpr size_t kMaxNameBytes = 47;
  static constexpr size_t kMaxAddressBytes = 119;

  // Maps the board at `path`, creating it (zeroed) if absent. A file of the
  // wrong size or magic is refused, never trusted.
  static Result<std::shared_ptr<AccessLinkBoard>> open(const std::string& path);
  // A board only this process sees: its own link, for a process on its own.
  static Result<std::shared_ptr<AccessLinkBoard>> private_board();
  ~AccessLinkBoard();
  AccessLinkBoard(const AccessLinkBoard&) = delete;
  AccessLinkBoard& operator=(const AccessLinkBoard&) = delete;

  // Claims a free slot for a process named `name` (1..47 bytes); resource_exhausted when all are taken.
  Result<AccessLink> join(std::string_view name, AccessLinkSpec spec);

  // The slot serving at `address`, where some process registered it.
  std::optional<int> slot_of(std::string_view address) const;

  enum class Direction { up, down };
  // Puts `bytes` on one direction of a slot's link no earlier than `ready`;
  // returns when its last byte has left. Back-to-back messages queue.
  Clock::time_point transmit(int slot, Direction direction, Clock::time_point ready, uint64_t bytes);
  // When a message from `from` to `to` (either may be absent: off the board)
  // handed over at `now` arrives: through from's up link, then to's down link,
  // then the larger of the two latencies.
  Clock::time_point deliver(std::optional<int> from, std::optional<int> to, Clock::time_point now, uint64_t bytes);

  std::string name_of(int slot) const;
  // The slots processes have joined, in slot order.
  std::vector<int> joined() const;
  // Bytes each direction of a slot has carried, for tests and reports.
  uint64_t bytes_carried(int slot, Direction direction) const;

 private:
  struct Layout;
  AccessLinkBoard(Layout* layout, size_t bytes) : layout_(layout), bytes_(bytes) {}
  friend class AccessLink;
  Status add_address(int slot, std::string_view address);
  Layout* layout_;
  size_t bytes_;
};

// The access link of this process, which NetemTransport's clients and servers
// use unless their options name another; none by default.
void set_process_access_link(std::optional<AccessLink> link);
std::optional<AccessLink> process_access_link();

// "200mbit,50ms" (parse_link's syntax) as an access link's spec.
Result<AccessLinkSpec> parse_access_link(std::string_view text);

}  // namespace swarm::netem
