// frame: one part of a multipart message, a shared byte buffer that may live
// in a std::string or in memory owned by someone else (a received ZeroMQ message).
//
// Copies share the bytes, so a frame crosses queues and threads without being
// copied; TensorViews decoded from it point straight into the received buffer.
// mutable_string() is the one way to edit bytes, and it copies first when the
// buffer is shared or foreign (copy-on-write).
//
//   swarm::wire::Frame owned = std::string(1 << 20, '\0');
//   auto held = std::make_shared<zmq::message_t>(std::move(msg));
//   swarm::wire::Frame adopted = swarm::wire::Frame::adopt(held->data<char>(), held->size(), held);
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace swarm::wire {

class Frame {
 public:
  Frame() : Frame(std::string()) {}
  Frame(std::string bytes) : owned_(std::make_shared<std::string>(std::move(bytes))) {}  // NOLINT
  Frame(const char* text) : Frame(std::string(text)) {}                                  // NOLINT
  Frame(const char* data, std::size_t size) : Frame(std::string(data, size)) {}

  // Wraps bytes that `keeper` keeps alive; no copy.
  static Frame adopt(const char* data, std::size_t size, std::shared_ptr<const void> keeper) {
    Frame frame(nullptr);
    frame.keeper_ = std::move(keeper);
    frame.data_ = data;
    frame.size_ = size;
    return frame;
  }

  const char* data() const { return owned_ ? owned_->data() : data_; }
  std::size_t size() const { return owned_ ? owned_->size() : size_; }
  bool empty() const { return size() == 0; }
  std::string_view view() const { return {data(), size()}; }
  operator std::string_view() const { return view(); }  // NOLINT: frames read like strings
  std::string str() const { return std::string(view()); }

  // The bytes as an editable string, detached from any other holder first.
  std::string& mutable_string() {
    if (!owned_ || owned_.use_count() > 1) {
      owned_ = std::make_shared<std::string>(view());
      keeper_.reset();
      data_ = nullptr;
      size_ = 0;
    }
    return *owned_;
  }

  // Shared ownership of the bytes, for handing them to a transport that sends
  // without copying (it keeps this alive until the send completes).
  std::shared_ptr<const void> keeper() const {
    if (owned_) return owned_;
    return keeper_;
  }

  friend bool operator==(const Frame& a, const Frame& b) { return a.view() == b.view(); }
  friend bool operator==(const Frame& a, std::string_view b) { return a.view() == b; }
  friend bool operator==(const Frame& a, const char* b) { return a.view() == std::string_view(b); }
  friend bool operator==(const Frame& a, const std::string& b) { return a.view() == b; }
  friend std::string operator+(std::string_view a, const Frame& b) {
    std::string out(a);
    out += b.view();
    return out;
  }
  friend std::string operator+(const char* a, const Frame& b) { return std::string_view(a) + b; }
  friend std::string operator+(const Frame& a, std::string_view b) {
    std::string out(a.view());
    out += b;
    return out;
  }
  friend std::string operator+(const Frame& a, char b) {
    std::string out(a.view());
    out += b;
    return out;
  }

 private:
  explicit Frame(std::nullptr_t) {}

  std::shared_ptr<std::string> owned_;
  std::shared_ptr<const void> keeper_;
  const char* data_ = nullptr;
  std::size_t size_ = 0;
};

// The parts of one message; each Frame shares its bytes instead of copying them.
struct Frames {
  std::vector<Frame> parts;

  std::vector<std::string_view> views() const {
    std::vector<std::string_view> out;
    out.reserve(parts.size());
    for (const Frame& part : parts) out.push_back(part.view());
    return out;
  }
};

}  // namespace swarm::wire
