// Seeded fuzzing of everything a peer or trainer parses out of the registry or
// out of a stage-mate's JSON: announcement and progress records, a donor's state
// info, a peer's stage spec and sample ledger, hex hashes, sealed envelopes and
// downloaded checkpoints. Nothing from outside is trusted: whatever the bytes,
// the parser answers a Result (never an exception), refuses every record that
// breaks its documented contract, and what it accepts is exactly what the JSON
// said (no silent conversion of 1.5 to 1, true to 1 or 2^64-1 to -1), and
// round-trips. (Every draw from the generator is sequenced, so a seed names the
// same cases under any compiler.)
//
// The oracle is a field table per record (type, range, required): a document is
// valid when every required field is present and every present field is of its
// JSON type and in its range; unknown fields are ignored. The generator mixes
// documents built field by field (right type in range, boundary and out-of-range
// values, wrong types, missing fields, junk keys, nested and deep values, long
// strings), random JSON values, byte mutations of valid records, deep nesting
// and random bytes, each case count below per parser.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "swarm/averaging/averaging_messages.h"
#include "swarm/averaging/progress.h"
#include "swarm/averaging/state_transfer.h"
#include "swarm/checkpoint/checkpoint.h"
#include "swarm/protocol/records.h"
#include "swarm/protocol/stage_protocol.h"
#include "swarm/security/identity.h"
#include "swarm/security/record_seal.h"

namespace swarm {
namespace {

using nlohmann::json;

constexpr int kCasesPerKind = 10'000;
// What one campaign may leave resident (parsers hold nothing past their call;
// the generator's long strings are freed). Measured: well under 16 MiB.
constexpr int64_t kRssGrowthBound = int64_t{128} << 20;
constexpr size_t kMaxStringBytes = size_t{1} << 20;  // the longest string a case holds
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
constexpr double kInf = std::numeric_limits<double>::infinity();

int64_t rss_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

std::string shorten(std::string_view text) {
  std::string out(text.substr(0, 240));
  if (text.size() > 240) out += "...(" + std::to_string(text.size()) + " bytes)";
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  return out;
}

// ---------------------------------------------------------------- the oracle ---

enum class Kind {
  text, nonempty_text, integer, number, boolean, hex, hashes, tensor_spec, dtype, codec, device,
  peer_state,  // a progress record's state: one of kPeerStates
  members,     // ids in strictly increasing order, non-empty, bounded in count and length
};

// The names a progress record's state may have (ProgressRecord::state_name's).
constexpr const char* kPeerStates[] = {"serving", "averaging", "resyncing", "looking"};
constexpr size_t kMaxMemberIdBytes = 256;

struct Field {
  std::string name;
  Kind kind;
  bool required = false;
  int64_t lo = kI64Min, hi = kI64Max;  // integer
  double dlo = -kInf, dhi = kInf;      // number (always finite as well)
};

// A JSON integer that fits int64 (nlohmann keeps 2^63..2^64-1 as unsigned).
bool fits_i64(const json& v) {
  return v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(kI64Max));
}

bool is_hex64(const json& v) {
  if (!v.is_string()) return false;
  const std::string& s = v.get_ref<const std::string&>();
  if (s.empty() || s.size() > 16) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool tensor_spec_ok(const json& v) {
  if (!v.is_object()) return false;
  const auto dtype = v.find("dtype");
  const auto dims = v.find("dims");
  if (dtype == v.end() || !dtype->is_string() || !dtype_from_name(dtype->get<std::string>())) return false;
  if (dims == v.end() || !dims->is_array() || dims->size() > static_cast<size_t>(Shape::kMaxRank)) return false;
  for (const json& d : *dims) {
    if (!fits_i64(d) || d.get<int64_t>() < -1) return false;
  }
  return true;
}

bool field_ok(const Field& f, const json& v) {
  switch (f.kind) {
    case Kind::text: return v.is_string();
    case Kind::nonempty_text: return v.is_string() && !v.get_ref<const std::string&>().empty();
    case Kind::integer: return fits_i64(v) && v.get<int64_t>() >= f.lo && v.get<int64_t>() <= f.hi;
    case Kind::number: {
      if (!v.is_number()) return false;
      const double d = v.get<double>();
      return std::isfinite(d) && d >= f.dlo && d <= f.dhi;
    }
    case Kind::boolean: return v.is_boolean();
    case Kind::hex: return is_hex64(v);
    case Kind::hashes: {
      if (!v.is_array() || v.size() > ProgressRecord::kMaxRecentHashes) return false;
      for (const json& e : v) {
        if (!e.is_array() || e.size() != 2 || !fits_i64(e[0]) || !is_hex64(e[1])) return false;
      }
      return true;
    }
    case Kind::tensor_spec: return tensor_spec_ok(v);
    case Kind::dtype: return v.is_string() && dtype_from_name(v.get<std::string>()).has_value();
    case Kind::codec: return v.is_string() && codec_from_name(v.get<std::string>()).has_value();
    case Kind::device: return v.is_string() && (v.get<std::string>() == "cpu" || v.get<std::string>() == "cuda");
    case Kind::peer_state:
      return v.is_string() && std::find(std::begin(kPeerStates), std::end(kPeerStates), v.get<std::string>()) !=
                                  std::end(kPeerStates);
    case Kind::members: {
      if (!v.is_array() || v.size() > ProgressRecord::kMaxMembers) return false;
      const std::string* last = nullptr;
      for (const json& id : v) {
        if (!id.is_string()) return false;
        const std::string& s = id.get_ref<const std::string&>();
        if (s.empty() || s.size() > kMaxMemberIdBytes || (last != nullptr && !(*last < s))) return false;
        last = &s;
      }
      return true;
    }
  }
  return false;
}

bool document_ok(const std::vector<Field>& fields, const json& doc) {
  if (!doc.is_object()) return false;
  for (const Field& f : fields) {
    const auto it = doc.find(f.name);
    if (it == doc.end()) {
      if (f.required) return false;
      continue;
    }
    if (!field_ok(f, *it)) return false;
  }
  return true;
}

// ------------------------------------------------------------- the generator ---

class Fuzz {
 public:
  explicit Fuzz(uint64_t seed) : g_(seed) {}
  uint64_t next() { return g_(); }
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(g_() % n); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(g_) < p; }

  std::string ascii(size_t max_len) {
    std::string s(below(max_len + 1), ' ');
    for (char& c : s) c = static_cast<char>(below(0x80));  // control characters too: valid UTF-8
    return s;
  }
  std::string hex(size_t len, bool upper = false) {
    std::string s(len, '0');
    for (char& c : s) c = (upper ? "0123456789ABCDEF" : "0123456789abcdef")[below(16)];
    return s;
  }
  std::string long_string() {
    const size_t n = chance(0.1) ? kMaxStringBytes : below(256 << 10);
    return std::string(n, static_cast<char>('a' + below(26)));
  }
  std::string trap_string() {
    static const char* const kTraps[] = {"",    "0",         "1.5",  "NaN",  "Infinity", "-Infinity",
                                         "-1",  "true",      "null", "0x10", "1e999",    "ffffffffffffffff",
                                         "FF",  "10000000000000000", "f32", "8bit",     "none",
                                         "é",   "\xe2\x82\xac", "g",   " 1"};
    return kTraps[below(std::size(kTraps))];
  }

  json any_integer() {
    switch (below(11)) {
      case 0: return 0;
      case 1: return static_cast<int64_t>(below(21)) - 10;
      case 2: return kI64Max;
      case 3: return kI64Min;
      case 4: return std::numeric_limits<uint64_t>::max();
      case 5: return uint64_t{1} << 63;
      case 6: return static_cast<int64_t>(next());
      case 7: return next();
      case 8: return int64_t{1} << 31;
      case 9: return -(int64_t{1} << 31) - 1;
      default: return int64_t{1} << 62;
    }
  }
  json any_float() {
    static const double kValues[] = {0.5,  -0.5, 1.5,     1e300, -1e300, 5e-324, -0.0, 0.0,
                                     9.2233720368547758e18, 1.8446744073709552e19, 3.0, 1e12,
                                     1.0000000000000002e12, 2147483648.0, -1.0, 1e-300};
    switch (below(4)) {
      case 0: return std::uniform_real_distribution<double>(-1e6, 1e6)(g_);
      case 1: {
        const double d = std::bit_cast<double>(next());  // NaN and infinities dump as null
        return d;
      }
      default: return kValues[below(std::size(kValues))];
    }
  }
  json any_string() {
    if (chance(0.02)) return long_string();
    return chance(0.5) ? json(trap_string()) : json(ascii(24));
  }

  // A JSON value `levels` deep (arrays and objects), built in place.
  json deep(size_t levels) {
    json root;
    json* at = &root;
    for (size_t i = 0; i < levels; ++i) {
      if (chance(0.5)) {
        *at = json::array({nullptr});
        at = &(*at)[0];
      } else {
        *at = json::object({{"a", nullptr}});
        at = &(*at)["a"];
      }
    }
    *at = any_integer();
    return root;
  }

  json any_value(int depth, const std::vector<Field>* keys = nullptr) {
    switch (below(depth > 0 ? 10 : 6)) {
      case 0: return nullptr;
      case 1: return chance(0.5);
      case 2: return any_integer();
      case 3: return any_float();
      case 4:
      case 5: return any_string();
      case 6: {
        json a = json::array();
        for (size_t i = below(5); i > 0; --i) a.push_back(any_value(depth - 1, keys));
        return a;
      }
      case 7:
      case 8: {
        json o = json::object();
        for (size_t i = below(5); i > 0; --i) {
          std::string key = keys != nullptr && !keys->empty() && chance(0.7) ? (*keys)[below(keys->size())].name
                                                                             : ascii(6);
          o[key] = any_value(depth - 1, keys);
        }
        return o;
      }
      default: return deep(1 + below(chance(0.1) ? 20000 : 64));
    }
  }

  // An integer in [lo, hi].
  int64_t in_range(int64_t lo, int64_t hi) {
    switch (below(4)) {
      case 0: return lo;
      case 1: return hi;
      default: {
        const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
        const uint64_t r = span == std::numeric_limits<uint64_t>::max() ? next() : next() % (span + 1);
        // Mostly small values, as real records hold.
        const uint64_t offset = chance(0.5) ? r % std::min<uint64_t>(span + 1, 1000) : r;
        return static_cast<int64_t>(static_cast<uint64_t>(lo) + offset);
      }
    }
  }
  double in_range(double lo, double hi) {
    const double a = std::isfinite(lo) ? lo : -1e9, b = std::isfinite(hi) ? hi : 1e9;
    switch (below(4)) {
      case 0: return a;
      case 1: return b;
      default: return std::uniform_real_distribution<double>(a, b)(g_);
    }
  }

  json tensor_spec_value() {
    static const char* const kDtypes[] = {"f32", "bf16", "f16", "i32", "i64", "u8", "F32", "f64", "", "int"};
    json spec = json::object();
    if (!chance(0.05)) spec["dtype"] = chance(0.85) ? json(kDtypes[below(6)]) : json(kDtypes[6 + below(4)]);
    if (!chance(0.05)) {
      json dims = json::array();
      const size_t rank = chance(0.9) ? below(5) : below(12);
      for (size_t i = 0; i < rank; ++i) {
        if (chance(0.85)) {
          dims.push_back(chance(0.3) ? int64_t{-1} : static_cast<int64_t>(below(4096)));
        } else {
          dims.push_back(chance(0.5) ? any_integer() : any_value(0));
        }
      }
      spec["dims"] = dims;
    }
    if (chance(0.1)) spec[ascii(4)] = any_value(1);
    return chance(0.95) ? spec : any_value(2);
  }

  // Mostly a value of the field's kind, in range; else its boundaries, out of
  // range, or any value at all.
  json field_value(const Field& f) {
    const double roll = std::uniform_real_distribution<double>(0, 1)(g_);
    if (roll > 0.85) return any_value(2);
    const bool good = roll < 0.6;
    switch (f.kind) {
      case Kind::text:
      case Kind::nonempty_text:
        if (good) return chance(0.02) ? long_string() : ascii(24);
        return chance(0.5) ? json("") : json(any_integer());
      case Kind::integer: {
        if (good) return in_range(f.lo, f.hi);
        switch (below(5)) {
          case 0: return f.lo > kI64Min ? json(f.lo - 1) : json(uint64_t{1} << 63);
          case 1: return f.hi < kI64Max ? json(f.hi + 1) : json(std::numeric_limits<uint64_t>::max());
          case 2: {  // a float
            const double v = static_cast<double>(in_range(f.lo, f.hi));
            return v + (chance(0.5) ? 0.0 : 0.5);
          }
          case 3: return std::to_string(in_range(f.lo, f.hi));                                // as text
          default: return chance(0.5);                                                         // a bool
        }
      }
      case Kind::number: {
        if (good) return chance(0.2) ? json(static_cast<int64_t>(in_range(0.0, 1e6))) : json(in_range(f.dlo, f.dhi));
        switch (below(5)) {
          case 0: return std::isfinite(f.dlo) ? f.dlo - 1.0 : -1e308;
          case 1: return std::isfinite(f.dhi) ? f.dhi * 2 + 1 : 1e308;
          case 2: return std::to_string(in_range(f.dlo, f.dhi));
          case 3: return chance(0.5);
          default: return any_float();
        }
      }
      case Kind::boolean:
        if (good) return chance(0.5);
        return chance(0.5) ? json(static_cast<int>(below(2))) : json(chance(0.5) ? "true" : "false");
      case Kind::hex:
        if (good) return hex(1 + below(16));
        switch (below(5)) {
          case 0: return hex(17 + below(8));
          case 1: return hex(1 + below(16), /*upper=*/true);
          case 2: return "";
          case 3: return "0x" + hex(4);
          default: return any_integer();
        }
      case Kind::hashes: {
        json a = json::array();
        const size_t n = chance(0.9) ? below(8) : (chance(0.5) ? 64 : 65 + below(10));
        for (size_t i = 0; i < n; ++i) {
          if (good || chance(0.8)) {
            a.push_back(json::array({static_cast<int64_t>(below(1000)), hex(16)}));
          } else {
            a.push_back(chance(0.5) ? json::array({any_integer(), hex(1 + below(20))}) : any_value(1));
          }
        }
        return a;
      }
      case Kind::tensor_spec: return tensor_spec_value();
      case Kind::dtype: return good ? json("f32") : any_string();
      case Kind::codec: {
        // The first five are codec_name's (kAllCodecIds); the rest are not names.
        static const char* const kCodecs[] = {"none", "fp16", "bf16", "8bit", "4bit", "blockwise8", "NONE", "", "int4",
                                              "4BIT", "blockwise4"};
        return good ? json(kCodecs[below(5)]) : json(kCodecs[below(std::size(kCodecs))]);
      }
      case Kind::device: {
        // The first two are devices; the rest are not.
        static const char* const kDevices[] = {"cpu", "cuda", "CUDA", "gpu", "", "cuda0", "tpu"};
        return good ? json(kDevices[below(2)]) : json(kDevices[below(std::size(kDevices))]);
      }
      case Kind::peer_state: {
        // The first four are states; the rest are not.
        static const char* const kStates[] = {"serving", "averaging", "resyncing", "looking", "Serving", "",
                                              "idle",    "averaging ", "resync",   "LOOKING", "departed"};
        if (good) return kStates[below(std::size(kPeerStates))];
        return chance(0.8) ? json(kStates[below(std::size(kStates))]) : json(static_cast<int64_t>(below(4)));
      }
      case Kind::members: return members_value(good);
    }
    return nullptr;
  }

  // Distinct ids in order: mostly short, sometimes at the bounds (kMaxMembers of
  // them, kMaxMemberIdBytes long) or past them.
  std::vector<std::string> member_ids(size_t n, size_t max_len) {
    std::set<std::string> ids;
    for (size_t tries = 0; ids.size() < n && tries < 4 * n + 8; ++tries) {
      std::string id = ascii(max_len);
      if (chance(0.02)) id = std::string(max_len, static_cast<char>('a' + below(26))) + id;
      id.resize(std::min(id.size(), max_len));
      if (!id.empty()) ids.insert(std::move(id));
    }
    return {ids.begin(), ids.end()};
  }
  json members_value(bool good) {
    const size_t n = chance(0.9) ? below(8)
                                 : (chance(0.5) ? ProgressRecord::kMaxMembers : ProgressRecord::kMaxMembers + 1 + below(4));
    const size_t max_len = chance(0.9) ? 16 : kMaxMemberIdBytes;
    std::vector<std::string> ids = member_ids(n, max_len);
    json a = json::array();
    for (const std::string& id : ids) a.push_back(id);
    if (good || a.empty() || chance(0.2)) return a;
    switch (below(7)) {  // one fault in an otherwise ordered list
      case 0: std::swap(a[0], a[a.size() - 1]); break;  // out of order (unless one id)
      case 1: {  // twice
        const json dup = a[below(a.size())];
        a.insert(a.begin() + static_cast<std::ptrdiff_t>(below(a.size() + 1)), dup);
        break;
      }
      case 2: a.insert(a.begin(), ""); break;                                                                    // empty
      case 3: a[below(a.size())] = std::string(kMaxMemberIdBytes + 1 + below(2), 'z'); break;                   // too long
      case 4: a[below(a.size())] = any_integer(); break;                                                         // not text
      case 5: a[below(a.size())] = any_value(1); break;
      default: return a.back();  // not an array
    }
    return a;
  }

  json document(const std::vector<Field>& fields) {
    json doc = json::object();
    for (const Field& f : fields) {
      if (chance(f.required ? 0.04 : 0.2)) continue;
      doc[f.name] = field_value(f);
    }
    for (size_t i = chance(0.3) ? 1 + below(3) : 0; i > 0; --i) doc[ascii(8)] = any_value(2, &fields);
    return doc;
  }

  std::string random_bytes(size_t max_len) {
    std::string s(below(max_len + 1), '\0');
    for (char& c : s) c = static_cast<char>(next());
    return s;
  }

  // Byte-level damage to a valid text: flips, truncation, insertions, duplication.
  std::string mutate(std::string text) {
    for (size_t m = 1 + below(4); m > 0; --m) {
      switch (below(6)) {
        case 0:
          if (!text.empty()) text[below(text.size())] ^= static_cast<char>(1u << below(8));
          break;
        case 1:
          if (!text.empty()) text[below(text.size())] = "{}[]\",:0-.eE \\"[below(14)];
          break;
        case 2: text.resize(below(text.size() + 1)); break;
        case 3: {
          const size_t at = below(text.size() + 1);
          text.insert(at, random_bytes(8));
          break;
        }
        case 4: {
          const size_t at = below(text.size() + 1);
          const size_t from = below(text.size() + 1);
          text.insert(at, text.substr(from, 16));
          break;
        }
        default:
          if (!text.empty()) {
            const size_t at = below(text.size());
            text.erase(at, 1 + below(8));
          }
          break;
      }
    }
    return text;
  }

  // One case: a text to parse. Valid record texts come from `valid`.
  std::string case_text(const std::vector<Field>& fields, const std::function<std::string(Fuzz&)>& valid) {
    const size_t mode = below(100);
    if (mode < 50) return document(fields).dump();                    // field by field
    if (mode < 60) return valid(*this);                               // an honest record
    if (mode < 75) return mutate(valid(*this));                       // damaged bytes
    if (mode < 85) return any_value(3, &fields).dump();               // any JSON at all
    if (mode < 92) return random_bytes(chance(0.1) ? 4096 : 64);      // not JSON
    if (mode < 96) {                                                  // deep nesting
      const size_t n = 1 + below(chance(0.2) ? 200'000 : 2'000);
      std::string open(n, '['), close(n, ']');
      if (chance(0.5)) return "{\"peer\":" + open + close + "}";
      return open + (chance(0.5) ? close : close.substr(1));
    }
    json doc = document(fields);  // a valid-shaped document with one field nested deep
    if (!fields.empty()) doc[fields[below(fields.size())].name] = deep(1 + below(5000));
    return doc.dump();
  }

 private:
  std::mt19937_64 g_;
};

// --------------------------------------------------------------- campaigns ---

struct CampaignReport {
  int cases = 0;
  int accepted = 0;
  int refused = 0;
  int honest = 0;  // valid-by-oracle cases
  std::vector<std::string> failures;
  void fail(std::string what) {
    if (failures.size() < 12) failures.push_back(std::move(what));
    ++failure_count;
  }
  int failure_count = 0;
};

// Runs kCasesPerKind cases through `parse`. `check(parsed, doc)` says what is
// wrong with an accepted record against the document it came from (fields not
// as the JSON said them, or no round trip): empty when nothing is.
template <typename T>
CampaignReport run_campaign(uint64_t seed, const std::vector<Field>& fields,
                            const std::function<Result<T>(const std::string&)>& parse,
                            const std::function<std::string(const T&, const json&)>& check,
                            const std::function<std::string(Fuzz&)>& valid) {
  Fuzz fuzz(seed);
  CampaignReport report;
  for (int i = 0; i < kCasesPerKind; ++i) {
    const std::string text = fuzz.case_text(fields, valid);
    const json doc = json::parse(text, nullptr, false);
    const bool expect_ok = !doc.is_discarded() && document_ok(fields, doc);
    ++report.cases;
    report.honest += expect_ok;
    std::optional<Result<T>> got;
    try {
      got.emplace(parse(text));
    } catch (const std::exception& e) {
      report.fail("threw " + std::string(e.what()) + " on " + shorten(text));
      continue;
    } catch (...) {
      report.fail("threw a non-std exception on " + shorten(text));
      continue;
    }
    if (!got->is_ok()) {
      ++report.refused;
      if (got->status().message().empty()) report.fail("an error without a message on " + shorten(text));
      if (expect_ok) report.fail("refused a valid record (" + got->status().to_string() + "): " + shorten(text));
      continue;
    }
    ++report.accepted;
    if (!expect_ok) {
      report.fail("accepted a bad record: " + shorten(text));
      continue;
    }
    if (std::string wrong = check(**got, doc); !wrong.empty()) report.fail(wrong + " in " + shorten(text));
  }
  return report;
}

void expect_clean(const std::string& name, const CampaignReport& r, int64_t rss_before) {
  const int64_t growth = rss_bytes() - rss_before;
  MESSAGE(name << ": " << r.cases << " cases, " << r.accepted << " accepted, " << r.refused << " refused, "
               << r.honest << " valid by the oracle; RSS +" << growth / 1024 << " KiB");
  for (const std::string& f : r.failures) MESSAGE(name << ": " << f);
  CHECK_MESSAGE(r.failure_count == 0, name << ": " << r.failure_count << " cases broke the contract");
  CHECK(r.cases == kCasesPerKind);
  CHECK(r.accepted + r.refused == r.cases);
  // The generator must exercise both sides of every parser, or it proves little.
  CHECK(r.honest > kCasesPerKind / 20);
  CHECK(r.refused > kCasesPerKind / 4);
  CHECK(growth < kRssGrowthBound);
}

// What the JSON says for `key`, or the default when absent.
int64_t int_of(const json& doc, const char* key, int64_t absent = 0) {
  const auto it = doc.find(key);
  return it == doc.end() ? absent : it->get<int64_t>();
}
double number_of(const json& doc, const char* key, double absent = 0) {
  const auto it = doc.find(key);
  return it == doc.end() ? absent : it->get<double>();
}
std::string text_of(const json& doc, const char* key) {
  const auto it = doc.find(key);
  return it == doc.end() ? std::string() : it->get<std::string>();
}
uint64_t hex_of(const json& doc, const char* key) {
  const auto it = doc.find(key);
  return it == doc.end() ? 0 : *parse_hex64(it->get<std::string>());
}
// Bitwise, so -0.0 and 0.0 differ.
bool same_double(double a, double b) { return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b); }

// --------------------------------------------------- announcement records ---

const std::vector<Field> kAnnouncementFields = {
    {"peer", Kind::nonempty_text, true},
    {"address", Kind::nonempty_text, true},
    {"stage", Kind::integer, false, 0, std::numeric_limits<int>::max()},
    {"throughput", Kind::number, false, kI64Min, kI64Max, 0.0, PeerAnnouncementRecord::kMaxThroughput},
    {"queue", Kind::integer, false, 0, kI64Max},
    {"serving", Kind::boolean, false},
    {"device", Kind::device, false},
};

bool same(const PeerAnnouncementRecord& a, const PeerAnnouncementRecord& b) {
  return a.peer_id == b.peer_id && a.address == b.address && a.stage == b.stage &&
         same_double(a.throughput, b.throughput) && a.queue_length == b.queue_length && a.serving == b.serving &&
         a.device == b.device;
}

PeerAnnouncementRecord random_announcement(Fuzz& f) {
  PeerAnnouncementRecord r;
  r.peer_id = "peer-" + f.ascii(12);
  r.address = "tcp://127.0.0.1:" + std::to_string(f.below(65536));
  r.stage = static_cast<int>(f.in_range(int64_t{0}, int64_t{std::numeric_limits<int>::max()}));
  r.throughput = f.in_range(0.0, PeerAnnouncementRecord::kMaxThroughput);
  r.queue_length = f.in_range(int64_t{0}, kI64Max);
  r.serving = f.chance(0.5);
  r.device = f.chance(0.5) ? "cpu" : "cuda";
  return r;
}

TEST_CASE("random peer announcements: an error for every bad one, valid ones exactly as sent") {
  const int64_t rss = rss_bytes();
  const CampaignReport report = run_campaign<PeerAnnouncementRecord>(
      0xA11CE, kAnnouncementFields, [](const std::string& text) { return PeerAnnouncementRecord::from_json(text); },
      [](const PeerAnnouncementRecord& r, const json& doc) -> std::string {
        PeerAnnouncementRecord said{text_of(doc, "peer"), text_of(doc, "address"),
                                    static_cast<int>(int_of(doc, "stage")), number_of(doc, "throughput"),
                                    int_of(doc, "queue"), !doc.contains("serving") || doc.at("serving").get<bool>(),
                                    doc.contains("device") ? doc.at("device").get<std::string>() : "cpu"};
        if (!same(r, said)) return "fields differ from the JSON (" + r.to_json() + ")";
        auto again = PeerAnnouncementRecord::from_json(r.to_json());
        if (!again.is_ok() || !same(*again, r)) return "no round trip of " + r.to_json();
        return "";
      },
      [](Fuzz& f) { return random_announcement(f).to_json(); });
  expect_clean("PeerAnnouncementRecord::from_json", report, rss);
}

TEST_CASE("valid peer announcements round-trip exactly") {
  Fuzz fuzz(7);
  int wrong = 0;
  for (int i = 0; i < kCasesPerKind; ++i) {
    const PeerAnnouncementRecord r = random_announcement(fuzz);
    auto back = PeerAnnouncementRecord::from_json(r.to_json());
    if (!back.is_ok() || !same(*back, r)) ++wrong;
  }
  CHECK(wrong == 0);
}

// ------------------------------------------------------- progress records ---

const std::vector<Field> kProgressFields = {
    {"peer", Kind::nonempty_text, true},
    {"address", Kind::text, false},
    {"stage", Kind::integer, false, 0, std::numeric_limits<int32_t>::max()},
    {"step", Kind::integer, true, 0, kI64Max},
    {"samples", Kind::integer, false, 0, kI64Max},
    {"samples_per_s", Kind::number, false, kI64Min, kI64Max, 0.0, kInf},
    {"time", Kind::number, true},
    {"state", Kind::peer_state, false},
    {"hash", Kind::hex, false},
    {"hashes", Kind::hashes, false},
    {"mates", Kind::integer, false, 0, std::numeric_limits<int32_t>::max()},
    {"group", Kind::hex, false},
    {"members", Kind::members, false},
    {"allreduce_bytes", Kind::integer, false, 0, kI64Max},
    {"allreduce_values", Kind::integer, false, 0, kI64Max},
    {"departed", Kind::boolean, false},
};

bool same(const ProgressRecord& a, const ProgressRecord& b) {
  return a.peer_id == b.peer_id && a.address == b.address && a.stage == b.stage && a.step == b.step &&
         a.samples == b.samples && same_double(a.samples_per_second, b.samples_per_second) &&
         same_double(a.published_at, b.published_at) && a.state == b.state &&
         a.params_hash == b.params_hash && a.committed_group == b.committed_group &&
         a.committed_members == b.committed_members &&
         a.stage_mates_seen == b.stage_mates_seen && a.recent_hashes == b.recent_hashes &&
         a.allreduce_bytes == b.allreduce_bytes && a.allreduce_values == b.allreduce_values && a.departed == b.departed;
}

ProgressRecord progress_said(const json& doc) {
  ProgressRecord r;
  r.peer_id = text_of(doc, "peer");
  r.address = text_of(doc, "address");
  r.stage = static_cast<int>(int_of(doc, "stage"));
  r.step = int_of(doc, "step");
  r.samples = int_of(doc, "samples");
  r.samples_per_second = number_of(doc, "samples_per_s");
  r.published_at = number_of(doc, "time");
  if (doc.contains("state")) {
    for (size_t i = 0; i < std::size(kPeerStates); ++i) {
      const auto state = static_cast<ProgressRecord::State>(i);
      if (ProgressRecord::state_name(state) == doc.at("state").get<std::string>()) r.state = state;
    }
  }
  r.params_hash = hex_of(doc, "hash");
  r.committed_group = hex_of(doc, "group");
  if (doc.contains("members")) r.committed_members = doc.at("members").get<std::vector<std::string>>();
  r.stage_mates_seen = static_cast<int>(int_of(doc, "mates"));
  r.allreduce_bytes = int_of(doc, "allreduce_bytes");
  r.allreduce_values = int_of(doc, "allreduce_values");
  r.departed = doc.contains("departed") && doc.at("departed").get<bool>();
  if (doc.contains("hashes")) {
    for (const json& e : doc.at("hashes")) r.recent_hashes.emplace_back(e[0].get<int64_t>(), *parse_hex64(e[1].get<std::string>()));
  }
  return r;
}

ProgressRecord random_progress(Fuzz& f) {
  ProgressRecord r;
  r.peer_id = "peer-" + f.ascii(12);
  r.address = "tcp://127.0.0.1:" + std::to_string(f.below(65536));
  r.stage = static_cast<int>(f.in_range(int64_t{0}, int64_t{std::numeric_limits<int32_t>::max()}));
  r.step = f.in_range(int64_t{0}, kI64Max);
  r.samples = f.in_range(int64_t{0}, kI64Max);
  r.samples_per_second = f.in_range(0.0, 1e9);
  r.published_at = f.in_range(-1e9, 1e9);
  r.state = static_cast<ProgressRecord::State>(f.below(std::size(kPeerStates)));
  r.params_hash = f.next();
  r.committed_group = f.next();
  const size_t members = f.chance(0.95) ? f.below(8) : ProgressRecord::kMaxMembers;
  const size_t id_bytes = f.chance(0.9) ? 16 : kMaxMemberIdBytes;
  r.committed_members = f.member_ids(members, id_bytes);
  r.stage_mates_seen = static_cast<int>(f.below(300));
  for (size_t i = f.below(17); i > 0; --i) {
    const int64_t step = f.in_range(int64_t{0}, kI64Max);
    r.recent_hashes.emplace_back(step, f.next());
  }
  r.allreduce_bytes = f.in_range(int64_t{0}, kI64Max);
  r.allreduce_values = f.in_range(int64_t{0}, kI64Max);
  r.departed = f.chance(0.5);
  return r;
}

TEST_CASE("random progress records: an error for every bad one, valid ones exactly as sent") {
  const int64_t rss = rss_bytes();
  const CampaignReport report = run_campaign<ProgressRecord>(
      0xB0B, kProgressFields, [](const std::string& text) { return ProgressRecord::from_json(text); },
      [](const ProgressRecord& r, const json& doc) -> std::string {
        if (!same(r, progress_said(doc))) return "fields differ from the JSON (" + r.to_json() + ")";
        auto again = ProgressRecord::from_json(r.to_json());
        if (!again.is_ok() || !same(*again, r)) return "no round trip of " + r.to_json();
        return "";
      },
      [](Fuzz& f) { return random_progress(f).to_json(); });
  expect_clean("ProgressRecord::from_json", report, rss);
}

TEST_CASE("valid progress records round-trip exactly") {
  Fuzz fuzz(8);
  int wrong = 0;
  for (int i = 0; i < kCasesPerKind; ++i) {
    const ProgressRecord r = random_progress(fuzz);
    auto back = ProgressRecord::from_json(r.to_json());
    if (!back.is_ok() || !same(*back, r)) ++wrong;
  }
  CHECK(wrong == 0);
}

// ------------------------------------------------------ a donor's state info ---

constexpr int64_t kMaxStateBytes = int64_t{1} << 30;

const std::vector<Field> kStateInfoFields = {
    {"step", Kind::integer, true, 0, kI64Max},
    {"bytes", Kind::integer, true, 0, kMaxStateBytes},
    {"hash", Kind::hex, true},
};

TEST_CASE("random state info from a donor: an error for every bad one, valid ones exactly as sent") {
  const int64_t rss = rss_bytes();
  // Only JSON objects reach parse_state_info (control_json refuses the rest);
  // anything else is refused here as control_json would.
  const CampaignReport report = run_campaign<StateInfo>(
      0x57A7E, kStateInfoFields,
      [](const std::string& text) -> Result<StateInfo> {
        const json meta = json::parse(text, nullptr, false);
        if (meta.is_discarded() || !meta.is_object()) return invalid_argument("not a JSON object");
        return parse_state_info(meta, kMaxStateBytes);
      },
      [](const StateInfo& info, const json& doc) -> std::string {
        if (info.step != int_of(doc, "step") || info.bytes != int_of(doc, "bytes") || info.hash != hex_of(doc, "hash")) {
          return "fields differ from the JSON";
        }
        return "";
      },
      [](Fuzz& f) {
        return json{{"step", f.in_range(int64_t{0}, kI64Max)},
                    {"bytes", f.in_range(int64_t{0}, kMaxStateBytes)},
                    {"hash", hex64(f.next())}}
            .dump();
      });
  expect_clean("parse_state_info", report, rss);
}

// ------------------------------------------- a peer's stage spec and ledger ---

const std::vector<Field> kStageSpecFields = {
    {"stage", Kind::integer, true, 0, std::numeric_limits<int>::max()},
    {"input", Kind::tensor_spec, true},
    {"output", Kind::tensor_spec, true},
    {"targets", Kind::tensor_spec, false},
    {"codec", Kind::codec, true},
    {"gradient_codec", Kind::codec, false},  // absent from older peers: the codec
};

TensorSpec tensor_spec_said(const json& j) {
  return TensorSpec{*dtype_from_name(j.at("dtype").get<std::string>()), j.at("dims").get<std::vector<int64_t>>()};
}

protocol::StageSpec random_spec(Fuzz& f) {
  auto tensor = [&] {
    TensorSpec t{kAllDTypes[f.below(std::size(kAllDTypes))], {}};
    for (size_t i = f.below(Shape::kMaxRank + 1); i > 0; --i) t.dims.push_back(f.chance(0.3) ? -1 : f.in_range(int64_t{0}, kI64Max));
    return t;
  };
  protocol::StageSpec spec;
  spec.stage = static_cast<int>(f.in_range(int64_t{0}, int64_t{std::numeric_limits<int>::max()}));
  spec.io.input = tensor();
  spec.io.output = tensor();
  if (f.chance(0.5)) spec.io.targets = tensor();
  spec.codec = kAllCodecIds[f.below(std::size(kAllCodecIds))];
  if (f.chance(0.5)) spec.gradient_codec = kAllCodecIds[f.below(std::size(kAllCodecIds))];
  return spec;
}

TEST_CASE("random stage specs from a peer's info reply: an error for every bad one, valid ones exactly as sent") {
  const int64_t rss = rss_bytes();
  const CampaignReport report = run_campaign<protocol::StageSpec>(
      0x5BEC, kStageSpecFields, [](const std::string& text) { return protocol::spec_from_json(text); },
      [](const protocol::StageSpec& spec, const json& doc) -> std::string {
        const bool targets = doc.contains("targets");
        if (spec.stage != int_of(doc, "stage") || !(spec.io.input == tensor_spec_said(doc.at("input"))) ||
            !(spec.io.output == tensor_spec_said(doc.at("output"))) || spec.io.targets.has_value() != targets ||
            (targets && !(*spec.io.targets == tensor_spec_said(doc.at("targets")))) ||
            spec.codec != *codec_from_name(doc.at("codec").get<std::string>()) ||
            protocol::codec_for(spec, protocol::TensorRole::grad_input) !=
                *codec_from_name(doc.value("gradient_codec", doc.at("codec").get<std::string>()))) {
          return "fields differ from the JSON (" + protocol::spec_to_json(spec) + ")";
        }
        auto again = protocol::spec_from_json(protocol::spec_to_json(spec));
        if (!again.is_ok() || protocol::spec_to_json(*again) != protocol::spec_to_json(spec)) return "no round trip";
        return "";
      },
      [](Fuzz& f) { return protocol::spec_to_json(random_spec(f)); });
  expect_clean("spec_from_json", report, rss);
}

std::vector<Field> ledger_fields() {
  std::vector<Field> fields;
  for (const auto& [name, member] : protocol::kSampleLedgerFields) {
    fields.push_back({std::string(name), Kind::integer, true, 0, kI64Max});
  }
  return fields;
}

TEST_CASE("random sample ledgers from a peer's info reply: an error for every bad one, valid ones exactly as sent") {
  const int64_t rss = rss_bytes();
  const std::vector<Field> fields = ledger_fields();
  const CampaignReport report = run_campaign<protocol::SampleLedger>(
      0x1ED6E, fields, [](const std::string& text) { return protocol::ledger_from_json(text); },
      [](const protocol::SampleLedger& ledger, const json& doc) -> std::string {
        for (const auto& [name, member] : protocol::kSampleLedgerFields) {
          if (ledger.*member != int_of(doc, std::string(name).c_str())) return "field " + std::string(name) + " differs";
        }
        auto again = protocol::ledger_from_json(protocol::ledger_to_json(ledger));
        if (!again.is_ok() || !(*again == ledger)) return "no round trip";
        return "";
      },
      [](Fuzz& f) {
        protocol::SampleLedger ledger;
        for (const auto& [name, member] : protocol::kSampleLedgerFields) ledger.*member = f.in_range(int64_t{0}, kI64Max);
        return protocol::ledger_to_json(ledger);
      });
  // Every field is required, so the field-by-field documents are rarely all valid.
  expect_clean("ledger_from_json", report, rss);
}

// What the fuzz found, reduced: each of these is refused by the oracle (a wrong
// JSON type, or a number the field cannot hold) and accepted by the parser,
// which converts it silently.
TEST_CASE("minimal reproducers: silent conversions in spec_from_json and ProgressRecord::from_json") {
  const std::string base_input = R"("input":{"dtype":"f32","dims":[-1,4]},"output":{"dtype":"f32","dims":[-1,8]},"codec":"8bit")";
  REQUIRE(protocol::spec_from_json("{\"stage\":0," + base_input + "}").is_ok());
  for (const std::string stage : {"1.5", "true", "-2147483649", "4294967296"}) {
    auto got = protocol::spec_from_json("{\"stage\":" + stage + "," + base_input + "}");
    CHECK_MESSAGE(!got.is_ok(), "stage " << stage << " accepted as " << (got.is_ok() ? got->stage : 0));
  }
  for (const std::string dim : {"0.5", "true", "18446744073709551615"}) {
    auto got = protocol::spec_from_json(R"({"stage":0,"input":{"dtype":"f32","dims":[)" + dim +
                                        R"(,4]},"output":{"dtype":"f32","dims":[-1,8]},"codec":"8bit"})");
    CHECK_MESSAGE(!got.is_ok(), "dim " << dim << " accepted as " << (got.is_ok() ? got->io.input.dims[0] : 0));
  }
  auto progress = ProgressRecord::from_json(R"({"peer":"p","step":0,"time":0,"hashes":[[18446744073709551615,"1"]]})");
  CHECK_MESSAGE(!progress.is_ok(), "a recent-hash step of 2^64-1 accepted as "
                                       << (progress.is_ok() && !progress->recent_hashes.empty() ? progress->recent_hashes[0].first : 0));
}

// ------------------------------------------------------------- hex hashes ---

TEST_CASE("random hex64 text: exactly 1 to 16 lowercase hex digits parse, to their value") {
  Fuzz fuzz(0x4E7);
  int accepted = 0, wrong = 0;
  for (int i = 0; i < kCasesPerKind; ++i) {
    std::string text;
    switch (fuzz.below(4)) {
      case 0: text = fuzz.hex(fuzz.below(20)); break;
      case 1: text = fuzz.hex(1 + fuzz.below(16), true); break;
      case 2: text = fuzz.mutate(hex64(fuzz.next())); break;
      default: text = fuzz.random_bytes(20); break;
    }
    auto got = parse_hex64(text);
    const bool expect = is_hex64(json(text));
    if (got.is_ok() != expect) ++wrong;
    if (got.is_ok()) {
      ++accepted;
      if (*got != std::stoull(text, nullptr, 16)) ++wrong;
    }
  }
  CHECK(wrong == 0);
  CHECK(accepted > kCasesPerKind / 10);
}

// -------------------------------------------------------- sealed envelopes ---

// The fields of an envelope that its seal covers, as open() reads them; none when
// the text is no envelope at all.
struct EnvelopeMeaning {
  std::string value, member;
  std::array<unsigned char, 32> signer{};
  std::array<unsigned char, 64> signature{};
  friend bool operator==(const EnvelopeMeaning&, const EnvelopeMeaning&) = default;
};

std::optional<EnvelopeMeaning> meaning_of(const std::string& text) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  for (const char* key : {"value", "signer", "member", "signature"}) {
    if (!j.contains(key) || !j.at(key).is_string()) return std::nullopt;
  }
  EnvelopeMeaning m;
  m.value = j.at("value").get<std::string>();
  m.member = j.at("member").get<std::string>();
  if (!security::from_hex(j.at("signer").get<std::string>(), m.signer.data(), m.signer.size()) ||
      !security::from_hex(j.at("signature").get<std::string>(), m.signature.data(), m.signature.size())) {
    return std::nullopt;
  }
  return m;
}

TEST_CASE("random and mutated sealed envelopes: none opens unless its sealed content is untouched") {
  const int64_t rss = rss_bytes();
  auto credentials = security::join_swarm("fuzz");
  REQUIRE(credentials.is_ok());
  auto stranger = security::join_swarm("another swarm");
  REQUIRE(stranger.is_ok());
  auto fellow = security::join_swarm("fuzz");  // a member with its own identity
  REQUIRE(fellow.is_ok());
  const RecordSealer sealer = security::make_record_sealer(*credentials);
  const RecordSealer stranger_sealer = security::make_record_sealer(*stranger);
  const RecordSealer fellow_sealer = security::make_record_sealer(*fellow);
  const std::string me = *security::peer_id_bound_to("fuzzpeer", credentials->self);
  const std::string fellow_id = *security::peer_id_bound_to("fellow", fellow->self);

  Fuzz fuzz(0x5EA1);
  auto random_record = [&](const std::string& subkey) {
    StoredRecord r;
    r.scope = fuzz.hex(40);
    r.subkey = subkey;
    r.seq = fuzz.next();
    r.expires_at = fuzz.in_range(0.0, 1e9);
    PeerAnnouncementRecord a{subkey, "tcp://127.0.0.1:" + std::to_string(fuzz.below(65536)),
                             static_cast<int>(fuzz.below(8)), fuzz.in_range(0.0, 1e4),
                             static_cast<int64_t>(fuzz.below(9))};
    r.value = fuzz.chance(0.8) ? a.to_json() : fuzz.ascii(64);
    return r;
  };

  int opened = 0, refused = 0, untouched = 0, wrong = 0, threw = 0;
  std::vector<std::string> failures;
  for (int i = 0; i < kCasesPerKind; ++i) {
    const StoredRecord original = random_record(me);
    auto sealed = sealer.seal(StoredRecord(original));
    REQUIRE(sealed.is_ok());
    StoredRecord probe = original;
    probe.value = *sealed;
    const size_t mode = fuzz.below(100);
    if (mode < 8) {
      // untouched
    } else if (mode < 35) {
      probe.value = fuzz.mutate(probe.value);
    } else if (mode < 60) {  // one field of the envelope replaced
      json j = json::parse(probe.value);
      static const char* const kKeys[] = {"value", "signer", "member", "signature"};
      const char* key = kKeys[fuzz.below(4)];
      switch (fuzz.below(6)) {
        case 0: j.erase(key); break;
        case 1: j[key] = fuzz.any_value(2); break;
        case 2: {  // one character changed
          std::string s = j[key].get<std::string>();
          if (!s.empty()) s[fuzz.below(s.size())] = "0123456789abcdefABCDEF x"[fuzz.below(24)];
          j[key] = s;
          break;
        }
        case 3: {  // upper-case hex: the same bytes, another spelling
          std::string s = j[key].get<std::string>();
          for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
          j[key] = s;
          break;
        }
        case 4: j[fuzz.ascii(5)] = fuzz.any_value(1); break;  // an extra field beside the sealed ones
        default: j[key] = fuzz.long_string(); break;
      }
      probe.value = j.dump();
    } else if (mode < 75) {  // the stored metadata changed under an intact envelope
      switch (fuzz.below(4)) {
        case 0: probe.scope = fuzz.chance(0.5) ? fuzz.hex(40) : probe.scope + "0"; break;
        case 1: probe.subkey = fuzz.chance(0.5) ? fellow_id : probe.subkey + "x"; break;
        case 2: probe.seq = fuzz.chance(0.5) ? probe.seq + 1 : fuzz.next(); break;
        default: probe.expires_at = fuzz.chance(0.5) ? probe.expires_at + 1 : std::nextafter(probe.expires_at, kInf); break;
      }
    } else if (mode < 82) {  // sealed by a stranger, or by a member for another's subkey
      const bool by_stranger = fuzz.chance(0.5);
      StoredRecord other = original;
      auto forged = (by_stranger ? stranger_sealer : fellow_sealer).seal(other);
      REQUIRE(forged.is_ok());
      probe.value = *forged;
    } else if (mode < 88) {  // a member's own seal, but its value names someone else
      StoredRecord named = random_record(fellow_id);
      named.value = PeerAnnouncementRecord{me, "tcp://127.0.0.1:1", 0, 0, 0}.to_json();
      auto forged = fellow_sealer.seal(named);
      REQUIRE(forged.is_ok());
      probe = named;
      probe.value = *forged;
    } else if (mode < 94) {
      probe.value = fuzz.any_value(3).dump();
    } else {
      probe.value = fuzz.random_bytes(fuzz.chance(0.1) ? 70'000 : 256);
    }

    // The seal covers the envelope's four fields (as decoded) and the stored
    // metadata: only when those are unchanged may it open, and then to the value.
    const auto meaning = meaning_of(probe.value);
    const auto sealed_meaning = meaning_of(*sealed);
    const bool intact = probe.value.size() <= security::kMaxSealedBytes && meaning && *meaning == *sealed_meaning &&
                        probe.scope == original.scope && probe.subkey == original.subkey &&
                        probe.seq == original.seq && same_double(probe.expires_at, original.expires_at);
    untouched += intact;
    Result<std::string> got = invalid_argument("not run");
    try {
      got = sealer.open(probe);
    } catch (...) {
      ++threw;
      continue;
    }
    if (got.is_ok()) {
      ++opened;
      if (!intact || *got != original.value) {
        ++wrong;
        if (failures.size() < 8) failures.push_back("opened a forgery: " + shorten(probe.value));
      }
    } else {
      ++refused;
      if (intact) {
        ++wrong;
        if (failures.size() < 8) failures.push_back("refused an intact seal (" + got.status().to_string() + ")");
      }
    }
  }
  const int64_t growth = rss_bytes() - rss;
  MESSAGE("record seals: " << kCasesPerKind << " envelopes, " << opened << " opened (" << untouched
                           << " intact), " << refused << " refused; RSS +" << growth / 1024 << " KiB");
  for (const auto& f : failures) MESSAGE(f);
  CHECK(threw == 0);
  CHECK(wrong == 0);
  CHECK(opened == untouched);
  CHECK(untouched > kCasesPerKind / 20);
  CHECK(refused > kCasesPerKind / 2);
  CHECK(growth < kRssGrowthBound);
}

// ------------------------------------------------- downloaded checkpoints ---

TEST_CASE("random and mutated state downloads: decode_checkpoint accepts only an unchanged encoding") {
  const int64_t rss = rss_bytes();
  Checkpoint state;
  state.step = 12;
  state.metadata = {{"model_config", "{\"d\": 4}"}, {"seed", "1"}};
  for (int t = 0; t < 3; ++t) {
    Tensor tensor = *Tensor::empty(Shape{3, 4 + t}, t == 2 ? DType::i64 : DType::f32);
    std::memset(tensor.raw_data(), 0x11 * (t + 1), tensor.size_bytes());
    state.tensors.push_back({"param/" + std::to_string(t), std::move(tensor)});
  }
  const std::string original = *encode_checkpoint(state);
  REQUIRE(decode_checkpoint(original, "fuzz").is_ok());
  Fuzz fuzz(0xC4EC);
  int accepted = 0, wrong = 0, threw = 0;
  for (int i = 0; i < kCasesPerKind; ++i) {
    std::string bytes = original;
    switch (fuzz.below(4)) {
      case 0: bytes = fuzz.mutate(bytes); break;
      case 1: {  // a forged 8-byte size or count anywhere in the header
        const size_t at = fuzz.below(std::min<size_t>(bytes.size(), 400) - 8);
        const uint64_t forged = fuzz.chance(0.5) ? ~uint64_t{0} - fuzz.below(16) : uint64_t{1} << (20 + fuzz.below(44));
        std::memcpy(bytes.data() + at, &forged, sizeof(forged));
        break;
      }
      case 2: bytes = fuzz.random_bytes(fuzz.chance(0.5) ? 64 : 4096); break;
      default: bytes.resize(fuzz.below(bytes.size() + 1)); break;
    }
    try {
      auto got = decode_checkpoint(bytes, "fuzz");
      if (!got.is_ok()) continue;
      ++accepted;
      // Checksums cover every byte: what decodes must be the original encoding.
      if (bytes != original) ++wrong;
    } catch (...) {
      ++threw;
    }
  }
  const int64_t growth = rss_bytes() - rss;
  MESSAGE("decode_checkpoint: " << kCasesPerKind << " cases, " << accepted << " accepted; RSS +" << growth / 1024
                                << " KiB");
  CHECK(threw == 0);
  CHECK(wrong == 0);
  CHECK(growth < kRssGrowthBound);
}

}  // namespace
}  // namespace swarm
