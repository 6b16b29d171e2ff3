// Each system package is usable through its //third_party target: headers
// found, libraries linked, and one real call made.
#include <sstream>
#include <string>

#include <Eigen/Core>
#include <cereal/archives/binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <opendht/infohash.h>
#include <xxhash.h>
#include <zmq.hpp>

#include <doctest/doctest.h>

TEST_CASE("ZeroMQ and cppzmq: a PAIR socket pair over inproc moves a message") {
  int major = 0, minor = 0, patch = 0;
  zmq_version(&major, &minor, &patch);
  CHECK(major >= 4);
  zmq::context_t context;
  zmq::socket_t server(context, zmq::socket_type::pair);
  zmq::socket_t client(context, zmq::socket_type::pair);
  server.bind("inproc://third-party-test");
  client.connect("inproc://third-party-test");
  client.send(zmq::buffer(std::string("ping")), zmq::send_flags::none);
  zmq::message_t received;
  REQUIRE(server.recv(received, zmq::recv_flags::none));
  CHECK(received.to_string() == "ping");
}

TEST_CASE("Cereal round-trips a struct through its binary archive") {
  std::stringstream buffer;
  std::vector<int> values{1, 2, 3};
  std::string name = "stage-2";
  {
    cereal::BinaryOutputArchive out(buffer);
    out(values, name);
  }
  std::vector<int> values_back;
  std::string name_back;
  cereal::BinaryInputArchive in(buffer);
  in(values_back, name_back);
  CHECK(values_back == values);
  CHECK(name_back == name);
}

TEST_CASE("OpenDHT hashes a key to a 160-bit InfoHash") {
  dht::InfoHash a = dht::InfoHash::get("swarm/stage/0");
  dht::InfoHash b = dht::InfoHash::get("swarm/stage/1");
  CHECK(a.toString().size() == 40);
  CHECK(a != b);
  CHECK(a == dht::InfoHash::get("swarm/stage/0"));
}

TEST_CASE("fmt, nlohmann-json, xxhash and Eigen answer") {
  CHECK(fmt::format("{:>5.1f}", 2.25) == "  2.2");
  auto j = nlohmann::json::parse(R"({"peers": [1, 2]})");
  CHECK(j["peers"].size() == 2);
  CHECK(XXH3_64bits("abc", 3) != XXH3_64bits("abd", 3));
  Eigen::Matrix2f m;
  m << 1, 2, 3, 4;
  CHECK((m * m)(1, 1) == 22.0f);
}
