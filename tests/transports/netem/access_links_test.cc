// Access links: each process's one link, shared by all its connections and
// found behind a server's address by clients in other processes (here: other
// mappings of one board file, which is all a process sees of it).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "transports/inproc/inproc_transport.h"
#include "transports/netem/access_links.h"
#include "transports/netem/netem_transport.h"

namespace swarm {
namespace {

using std::chrono::milliseconds;
using Netem = NetemTransport<InprocTransport>;
using Direction = netem::AccessLinkBoard::Direction;

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return (std::filesystem::path(dir != nullptr ? dir : "/tmp") / name).string();
}

std::shared_ptr<netem::AccessLinkBoard> open_or_die(const std::string& path) {
  auto board = netem::AccessLinkBoard::open(path);
  REQUIRE_MESSAGE(board.is_ok(), board.status().to_string());
  return std::move(board).value();
}

netem::AccessLink join_or_die(netem::AccessLinkBoard& board, const std::string& name, double bytes_per_s,
                              netem::Duration latency = {}) {
  auto link = board.join(name, {.bandwidth_bytes_per_s = bytes_per_s, .latency = latency});
  REQUIRE_MESSAGE(link.is_ok(), link.status().to_string());
  return *link;
}

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

TEST_CASE("two mappings of one board share slots, addresses and the time a link is busy") {
  const std::string path = temp_path("shared.board");
  std::filesystem::remove(path);
  auto first = open_or_die(path);
  auto second = open_or_die(path);
  const netem::AccessLink trainer = join_or_die(*first, "trainer", 10e6);
  const netem::AccessLink peer = join_or_die(*second, "s0p0", 0);
  CHECK(trainer.slot() != peer.slot());
  REQUIRE(peer.add_address("tcp://127.0.0.1:4000").is_ok());
  CHECK(first->slot_of("tcp://127.0.0.1:4000") == peer.slot());
  CHECK(first->slot_of("tcp://127.0.0.1:4001") == std::nullopt);
  CHECK(second->name_of(trainer.slot()) == "trainer");

  // 1 MB at 10 MB/s from each mapping: the second queues behind the first.
  const Clock::time_point now = Clock::now();
  const Clock::time_point a = first->transmit(trainer.slot(), Direction::up, now, 1'000'000);
  const Clock::time_point b = second->transmit(trainer.slot(), Direction::up, now, 1'000'000);
  CHECK(seconds_between(now, a) == doctest::Approx(0.1).epsilon(0.001));
  CHECK(seconds_between(now, b) == doctest::Approx(0.2).epsilon(0.001));
  // The other direction is its own queue.
  const Clock::time_point c = second->transmit(trainer.slot(), Direction::down, now, 1'000'000);
  CHECK(seconds_between(now, c) == doctest::Approx(0.1).epsilon(0.001));
  CHECK(first->bytes_carried(trainer.slot(), Direction::up) == 2'000'000);
  // An unlimited link delays nothing but still counts.
  CHECK(first->transmit(peer.slot(), Direction::up, now, 5'000'000) == now);
  CHECK(second->bytes_carried(peer.slot(), Direction::up) == 5'000'000);
}

TEST_CASE("a message queues behind its sender's uploads and its receiver's downloads, then waits the latency") {
  auto board = netem::AccessLinkBoard::private_board().value();
  const netem::AccessLink a = join_or_die(*board, "a", 10e6, milliseconds(20));
  const netem::AccessLink b = join_or_die(*board, "b", 10e6, milliseconds(50));
  const netem::AccessLink c = join_or_die(*board, "c", 0);
  const Clock::time_point now = Clock::now();
  // c (unlimited) sends b 1 MB first; a's 1 MB then finds b's down link busy until 0.1 s.
  (void)board->deliver(c.slot(), b.slot(), now, 1'000'000);
  const Clock::time_point arrives = board->deliver(a.slot(), b.slot(), now, 1'000'000);
  // a's up: 0 to 0.1 s; b's down: 0.1 to 0.2 s; then b's 50 ms, the larger latency.
  CHECK(seconds_between(now, arrives) == doctest::Approx(0.25).epsilon(0.001));
  // Off the board at one end: only the other end's link.
  CHECK(seconds_between(now, board->deliver(std::nullopt, c.slot(), now, 0)) == doctest::Approx(0).epsilon(0.001));
  CHECK(seconds_between(now, board->deliver(a.slot(), std::nullopt, now + milliseconds(300), 0)) ==
        doctest::Approx(0.32).epsilon(0.001));
}

TEST_CASE("a board file that is not one is refused, as are bad names, specs and a full board") {
  const std::string path = temp_path("not_a_board");
  {
    std::ofstream out(path, std::ios::trunc);
    out << "hello";
  }
  CHECK(netem::AccessLinkBoard::open(path).status().code() == StatusCode::invalid_argument);
  CHECK(netem::AccessLinkBoard::open("/nonexistent-dir/board").status().code() == StatusCode::unavailable);

  auto board = netem::AccessLinkBoard::private_board().value();
  CHECK(board->join("", {}).status().code() == StatusCode::invalid_argument);
  CHECK(board->join(std::string(48, 'x'), {}).status().code() == StatusCode::invalid_argument);
  CHECK(board->join("x", {.bandwidth_bytes_per_s = -1}).status().code() == StatusCode::invalid_argument);
  CHECK(board->join("x", {.latency = milliseconds(-1)}).status().code() == StatusCode::invalid_argument);
  const netem::AccessLink link = join_or_die(*board, "x", 0);
  for (int i = 0; i < netem::AccessLinkBoard::kMaxAddresses; ++i) {
    CHECK(link.add_address("inproc://a" + std::to_string(i)).is_ok());
  }
  CHECK(link.add_address("inproc://one-more").code() == StatusCode::resource_exhausted);
  CHECK(link.add_address(std::string(200, 'a')).code() == StatusCode::invalid_argument);
  for (int i = 1; i < netem::AccessLinkBoard::kMaxSlots; ++i) join_or_die(*board, "p" + std::to_string(i), 0);
  CHECK(board->join("last", {}).status().code() == StatusCode::resource_exhausted);
}

// Sends 1 MB on each of two connections at once and returns when the later reply came.
double two_uploads_seconds(const std::string& first, const std::string& second, const NetemOptions& options) {
  auto one = Netem::connect(first, NetemClientOptions(options));
  auto two = Netem::connect(second, NetemClientOptions(options));
  REQUIRE(one.is_ok());
  REQUIRE(two.is_ok());
  const Clock::time_point start = Clock::now();
  Call a = one->call(wire::Frames{{std::string(1'000'000, 'a')}}, Clock::now() + std::chrono::seconds(20));
  Call b = two->call(wire::Frames{{std::string(1'000'000, 'b')}}, Clock::now() + std::chrono::seconds(20));
  REQUIRE(a.get().is_ok());
  REQUIRE(b.get().is_ok());
  return seconds_between(start, Clock::now());
}

TEST_CASE("a process's connections share its access link; each connection's own link does not") {
  auto board = netem::AccessLinkBoard::private_board().value();
  const netem::AccessLink trainer = join_or_die(*board, "trainer", 10e6);
  const netem::AccessLink peers = join_or_die(*board, "peers", 0);
  // Servers bound while the process's link is the peers' register their addresses under it.
  netem::set_process_access_link(peers);
  auto reply_small = [](const PeerIdentity&, wire::Frames) { return wire::Frames{{std::string("ok")}}; };
  auto first = Netem::bind("inproc://access-first", {});
  auto second = Netem::bind("inproc://access-second", {});
  netem::set_process_access_link(std::nullopt);
  REQUIRE(first.is_ok());
  REQUIRE(second.is_ok());
  REQUIRE(first->serve(reply_small).is_ok());
  REQUIRE(second->serve(reply_small).is_ok());
  CHECK(board->slot_of("inproc://access-first") == peers.slot());

  NetemOptions shared;
  shared.access = trainer;
  const double shared_seconds = two_uploads_seconds("inproc://access-first", "inproc://access-second", shared);
  CHECK(shared_seconds >= 0.2);
  CHECK(board->bytes_carried(trainer.slot(), Direction::up) >= 2'000'000);
  CHECK(board->bytes_carried(peers.slot(), Direction::down) >= 2'000'000);
  CHECK(board->bytes_carried(peers.slot(), Direction::up) < 100);

  // The per-connection link gives each connection the whole 10 MB/s.
  NetemOptions per_connection;
  per_connection.up = {.bandwidth_bytes_per_s = 10e6};
  const double separate_seconds =
      two_uploads_seconds("inproc://access-first", "inproc://access-second", per_connection);
  CHECK(separate_seconds >= 0.1);
  CHECK(separate_seconds < 0.19);
}

}  // namespace
}  // namespace swarm
