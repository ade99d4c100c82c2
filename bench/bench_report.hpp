#pragma once
// What gradcomp-bench (CPU) and gradcomp-bench-cuda share: option parsing, the seeded N(0, σ)
// gradient, the checksum that keeps timed work observable, the record of one measurement and its
// ratio to the same run's copy, the table, the PASS/FAIL lines, the JSON file with the run's
// machine and build, and the comparison of two such files.
//
// The JSON file is an array of records; each carries a "run" object: the CPU model and logical CPU
// count, the compiler, the C++ flags of the build's configuration, gradcomp's version and the
// commit built. The commit and flags come from the library gradcomp_build_info, whose source the
// build writes at every build (cmake/gradcomp-build-info.cmake): the commit is "unknown" outside a
// git checkout (a release tarball, a package build) and ends in "-dirty" when tracked files had
// changes.
#include <gradcomp/version.hpp>

#include <gradcomp_build_info.hpp>

#if defined(__APPLE__)
#  include <sys/sysctl.h>
#endif

#include <fmt/core.h>
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace gradcomp_bench {

// ---- command line -----------------------------------------------------------------------------

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline std::uint64_t parse_unsigned(std::string_view text, std::string_view what) {
  std::uint64_t value = 0;
  const char* const end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc{} || ptr != end || text.empty())
    throw usage_error(fmt::format("{}: '{}' is not a non-negative integer", what, text));
  return value;
}

/// A size: decimal, or 2^K; at least 100 and at most `largest`.
inline std::uint64_t parse_size(std::string_view text, std::uint64_t largest) {
  std::uint64_t n = 0;
  if (text.starts_with("2^")) {
    const std::uint64_t exponent = parse_unsigned(text.substr(2), "--n");
    if (exponent > 40) throw usage_error(fmt::format("--n: 2^{} is too large", exponent));
    n = std::uint64_t{1} << exponent;
  } else {
    n = parse_unsigned(text, "--n");
  }
  if (n < 100) throw usage_error(fmt::format("--n: {} is too small (at least 100 elements)", n));
  if (n > largest) throw usage_error(fmt::format("--n: {} is too large (at most {})", n, largest));
  return n;
}

inline int parse_count(std::string_view text, std::string_view what, int low) {
  const std::uint64_t value = parse_unsigned(text, what);
  if (value < static_cast<std::uint64_t>(low) || value > 100000)
    throw usage_error(fmt::format("{}: {} is out of range [{}, 100000]", what, value, low));
  return static_cast<int>(value);
}

// ---- gradient and checksum ---------------------------------------------------------------------

inline std::uint64_t splitmix64(std::uint64_t& state) noexcept {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// N(0, stddev) by Box–Muller on splitmix64: the same values on every platform for a seed.
inline void fill_gradient(std::span<float> gradient, std::uint64_t seed, double stddev) {
  constexpr double two_pi = 6.283185307179586477;
  constexpr double unit = 0x1.0p-53;
  std::uint64_t state = seed;
  for (std::size_t i = 0; i < gradient.size(); i += 2) {
    const double u1 = (static_cast<double>(splitmix64(state) >> 11) + 1.0) * unit;  // (0, 1]
    const double u2 = static_cast<double>(splitmix64(state) >> 11) * unit;          // [0, 1)
    const double r = stddev * std::sqrt(-2.0 * std::log(u1));
    gradient[i] = static_cast<float>(r * std::cos(two_pi * u2));
    if (i + 1 < gradient.size()) gradient[i + 1] = static_cast<float>(r * std::sin(two_pi * u2));
  }
}

/// FNV-1a over observed outputs, printed at the end so no timed work can be discarded.
class checksum {
 public:
  void add(std::uint64_t v) noexcept {
    for (int b = 0; b < 8; ++b) {
      hash_ ^= (v >> (8 * b)) & 0xFFu;
      hash_ *= 0x100000001B3ull;
    }
  }
  void add(float v) noexcept {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    add(std::uint64_t{bits});
  }
  /// 64 strided elements of a dense buffer.
  void add_sample(std::span<const float> dense) noexcept {
    if (dense.empty()) return;
    const std::size_t stride = std::max<std::size_t>(1, dense.size() / 64);
    for (std::size_t i = 0; i < dense.size(); i += stride) add(dense[i]);
  }
  /// Size, first and last bytes of an encoded message.
  void add_message(std::span<const std::byte> message) noexcept {
    add(std::uint64_t{message.size()});
    if (message.empty()) return;
    add(std::uint64_t{std::to_integer<std::uint8_t>(message.front())});
    add(std::uint64_t{std::to_integer<std::uint8_t>(message.back())});
  }
  [[nodiscard]] std::uint64_t value() const noexcept { return hash_; }

 private:
  std::uint64_t hash_ = 0xCBF29CE484222325ull;
};

// ---- records -----------------------------------------------------------------------------------

struct timing {
  double best = 0.0;    ///< Fastest timed run, seconds.
  double median = 0.0;  ///< Median timed run, seconds.
};

struct record {
  std::string name;
  std::uint64_t n = 0;
  timing time;
  double copy_median = 0.0;                 ///< memcpy/copy median at the same n, seconds.
  double compression_ratio = 1.0;           ///< Dense bytes / encoded bytes; 1 for baselines.
  std::string baseline;                     ///< Name of the baseline record, or empty.
  std::optional<double> speedup;            ///< Baseline median / this median.
  std::optional<double> achieved_density;   ///< Threshold and dynamic: kept / n.
  std::optional<double> max_error;          ///< ZFP decode: largest |x − decoded|.
  std::optional<double> error_to_bound;     ///< ZFP decode: largest |x − decoded| / the documented bound.
  std::string backend;                      ///< Executor that ran it, when not the table's (e.g. "reference").
  std::size_t value_bytes = sizeof(float);  ///< Bytes per gradient value: 4, or 2 for a bf16 gradient.

  [[nodiscard]] double dense_bytes() const noexcept { return static_cast<double>(n * value_bytes); }
  [[nodiscard]] double gradient_gbps() const noexcept { return dense_bytes() / time.median / 1e9; }
  [[nodiscard]] double copy_gbps() const noexcept { return dense_bytes() / copy_median / 1e9; }
  [[nodiscard]] double ratio_to_copy() const noexcept { return gradient_gbps() / copy_gbps(); }
};

inline const record* find_record(const std::vector<record>& records, std::string_view name, std::uint64_t n) {
  for (const record& r : records)
    if (r.name == name && r.n == n) return &r;
  return nullptr;
}

inline void require_check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("self-check failed: " + what);
}

// ---- the run: machine and build -----------------------------------------------------------------

/// What a run was measured on and built with, written with every JSON record.
struct run_context {
  std::string cpu;          ///< CPU model ("unknown" where the system does not say).
  unsigned logical_cpus = 0;  ///< Logical CPUs of the machine (std::thread::hardware_concurrency).
  std::string compiler;     ///< Compiler and version, from its predefined macros.
  std::string flags;        ///< Flags of the build's configuration (CMAKE_CXX_FLAGS[_<CONFIG>], CUDA's for nvcc).
  std::string version;      ///< gradcomp's version.
  std::string commit;       ///< The commit built ("unknown" outside a git checkout; "-dirty" with changes).
};

/// The CPU model: /proc/cpuinfo's "model name" on Linux, machdep.cpu.brand_string on macOS.
inline std::string cpu_model() {
#if defined(__APPLE__)
  char name[256] = {};
  std::size_t size = sizeof name - 1;
  if (sysctlbyname("machdep.cpu.brand_string", name, &size, nullptr, 0) == 0) return name;
#else
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (!line.starts_with("model name")) continue;
    const std::size_t colon = line.find(':');
    if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
  }
#endif
  return "unknown";
}

/// The compiler of this translation unit, with the host compiler's name under nvcc.
inline std::string compiler_name() {
#if defined(__clang__)
  std::string host = fmt::format("Clang {}.{}.{}", __clang_major__, __clang_minor__, __clang_patchlevel__);
#elif defined(__GNUC__)
  std::string host = fmt::format("GCC {}.{}.{}", __GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__);
#elif defined(_MSC_FULL_VER)
  std::string host = fmt::format("MSVC {}", _MSC_FULL_VER);
#else
  std::string host = "unknown";
#endif
#if defined(__NVCC__)
  return fmt::format("nvcc {}.{}.{} (host {})", __CUDACC_VER_MAJOR__, __CUDACC_VER_MINOR__, __CUDACC_VER_BUILD__, host);
#else
  return host;
#endif
}

/// This run's machine and build.
inline run_context describe_run() {
  return {
    .cpu = cpu_model(), .logical_cpus = std::thread::hardware_concurrency(), .compiler = compiler_name(),
#if defined(__CUDACC__)
    .flags = gradcomp_build_cuda_flags(),
#else
    .flags = gradcomp_build_flags(),
#endif
    .version = fmt::format("{}.{}.{}", gradcomp::version_major, gradcomp::version_minor, gradcomp::version_patch),
    .commit = gradcomp_build_commit()
  };
}

// ---- output ------------------------------------------------------------------------------------

inline std::string optional_text(const std::optional<double>& v, std::string_view spec) {
  return v ? fmt::format(fmt::runtime(spec), *v) : std::string("-");
}

inline void print_table(const std::vector<record>& records, std::string_view backend) {
  constexpr std::string_view row = "{:<24} {:<7} {:>10} {:>10} {:>10} {:>9} {:>9} {:>8} {:>9} {:<24} {:>8} {:>9}\n";
  fmt::print(fmt::runtime(row), "name", "backend", "n", "best ms", "median ms", "grad GB/s", "copy GB/s", "x copy",
             "compress", "baseline", "speedup", "density");
  fmt::print("{}\n", std::string(24 + 7 + 10 + 10 + 10 + 9 + 9 + 8 + 9 + 24 + 8 + 9 + 11, '-'));
  std::uint64_t last_n = 0;
  for (const record& r : records) {
    if (last_n != 0 && r.n != last_n) fmt::print("\n");
    last_n = r.n;
    fmt::print(fmt::runtime(row), r.name, r.backend.empty() ? backend : std::string_view(r.backend), r.n,
               fmt::format("{:.3f}", r.time.best * 1e3), fmt::format("{:.3f}", r.time.median * 1e3),
               fmt::format("{:.2f}", r.gradient_gbps()), fmt::format("{:.2f}", r.copy_gbps()),
               fmt::format("{:.3f}", r.ratio_to_copy()), fmt::format("{:.1f}", r.compression_ratio),
               r.baseline.empty() ? std::string("-") : r.baseline, optional_text(r.speedup, "{:.2f}"),
               optional_text(r.achieved_density, "{:.5f}"));
  }
}

/// Prints one PASS/FAIL line of the targets.
inline void target_line(bool pass, const std::string& text) { fmt::print("{}  {}\n", pass ? "PASS" : "FAIL", text); }

inline void append_json_string(std::string& s, std::string_view text) {
  s += '"';
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      s += '\\';
      s += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      fmt::format_to(std::back_inserter(s), "\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
    } else {
      s += c;
    }
  }
  s += '"';
}

/// Shortest round-trip decimal form; null for a value JSON cannot hold.
inline void append_json_number(std::string& s, std::optional<double> v) {
  if (v && std::isfinite(*v)) fmt::format_to(std::back_inserter(s), "{}", *v);
  else
    s += "null";
}

inline std::string run_json(const run_context& run) {
  std::string s = "{\"cpu\": ";
  append_json_string(s, run.cpu);
  fmt::format_to(std::back_inserter(s), ", \"logical_cpus\": {}, \"compiler\": ", run.logical_cpus);
  append_json_string(s, run.compiler);
  s += ", \"flags\": ";
  append_json_string(s, run.flags);
  s += ", \"version\": ";
  append_json_string(s, run.version);
  s += ", \"commit\": ";
  append_json_string(s, run.commit);
  return s + "}";
}

inline std::string to_json(const std::vector<record>& records, std::string_view backend, std::string_view device,
                           const run_context& run = describe_run()) {
  const std::string run_text = run_json(run);
  std::string s = "[\n";
  for (std::size_t i = 0; i < records.size(); ++i) {
    const record& r = records[i];
    s += "  {\"name\": ";
    append_json_string(s, r.name);
    s += ", \"backend\": ";
    append_json_string(s, r.backend.empty() ? backend : std::string_view(r.backend));
    if (!device.empty()) {
      s += ", \"device\": ";
      append_json_string(s, device);
    }
    fmt::format_to(std::back_inserter(s), ", \"n\": {}, \"value_bytes\": {}", r.n, r.value_bytes);
    s += ", \"seconds_best\": ";
    append_json_number(s, r.time.best);
    s += ", \"seconds_median\": ";
    append_json_number(s, r.time.median);
    s += ", \"gradient_gbps\": ";
    append_json_number(s, r.gradient_gbps());
    s += ", \"copy_gbps\": ";
    append_json_number(s, r.copy_gbps());
    s += ", \"ratio_to_copy\": ";
    append_json_number(s, r.ratio_to_copy());
    s += ", \"compression_ratio\": ";
    append_json_number(s, r.compression_ratio);
    s += ", \"baseline\": ";
    append_json_string(s, r.baseline);
    s += ", \"speedup_vs_baseline\": ";
    append_json_number(s, r.speedup);
    if (r.achieved_density) {
      s += ", \"achieved_density\": ";
      append_json_number(s, r.achieved_density);
    }
    if (r.max_error) {
      s += ", \"max_error\": ";
      append_json_number(s, r.max_error);
      s += ", \"max_error_to_bound\": ";
      append_json_number(s, r.error_to_bound);
    }
    s += ", \"run\": " + run_text;
    s += i + 1 < records.size() ? "},\n" : "}\n";
  }
  s += "]\n";
  return s;
}

/// The main of a bench: parses the options with `parse(argc, argv)` (a usage_error exits 2), prints
/// `usage` for --help, checks that the --json file can be written before the long run, and
/// returns what `run(options)` returns (an exception exits 1).
template <class Parse, class Run>
int bench_main(std::string_view program, std::string_view usage, int argc, char** argv, Parse parse, Run run) {
  decltype(parse(argc, argv)) opt;
  try {
    opt = parse(argc, argv);
  } catch (const usage_error& e) {
    fmt::print(stderr, "{}: {}\n(run {} --help for the options)\n", program, e.what(), program);
    return 2;
  }
  if (opt.help) {
    fmt::print("{}", usage);
    return 0;
  }
  try {
    if (!opt.json.empty()) {  // fail before a long run, not after it
      std::FILE* const probe = std::fopen(opt.json.c_str(), "ab");
      if (probe == nullptr) throw std::runtime_error("cannot open '" + opt.json + "' for writing");
      std::fclose(probe);
    }
    return run(opt);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "{}: error: {}\n", program, e.what());
    return 1;
  }
}

inline void write_file(const std::string& path, const std::string& text) {
  std::FILE* const file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) throw std::runtime_error("cannot open '" + path + "' for writing");
  const bool written = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  const bool closed = std::fclose(file) == 0;
  if (!written || !closed) throw std::runtime_error("cannot write '" + path + "'");
}

// ---- comparing two JSON files -----------------------------------------------------------------

/// A JSON value, as much of JSON as the benches write and read back.
struct json_value {
  enum class kind : std::uint8_t { null, boolean, number, string, array, object };
  kind type = kind::null;
  bool boolean = false;
  double number = 0.0;
  std::string text;
  std::vector<json_value> items;                            ///< An array's elements.
  std::vector<std::pair<std::string, json_value>> members;  ///< An object's members, in order.

  /// The member `key` of an object, or nullptr.
  [[nodiscard]] const json_value* find(std::string_view key) const {
    for (const auto& [name, value] : members)
      if (name == key) return &value;
    return nullptr;
  }
  /// The string member `key`, or `fallback`.
  [[nodiscard]] std::string string_or(std::string_view key, std::string_view fallback) const {
    const json_value* v = find(key);
    return v != nullptr && v->type == kind::string ? v->text : std::string(fallback);
  }
  /// The number member `key`, if there is one.
  [[nodiscard]] std::optional<double> number_at(std::string_view key) const {
    const json_value* v = find(key);
    return v != nullptr && v->type == kind::number ? std::optional<double>(v->number) : std::nullopt;
  }
};

/// Parses JSON text (RFC 8259; \u escapes of the basic plane); throws std::runtime_error naming the
/// byte offset of the first error.
class json_parser {
 public:
  explicit json_parser(std::string_view text) : text_(text) {}

  json_value parse() {
    json_value v = value();
    skip_space();
    if (at_ != text_.size()) fail("text after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(std::string_view what) const {
    throw std::runtime_error(fmt::format("JSON: {} at byte {}", what, at_));
  }
  void skip_space() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\r' || text_[at_] == '\t'))
      ++at_;
  }
  bool take(char c) {
    skip_space();
    if (at_ < text_.size() && text_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!take(c)) fail(fmt::format("'{}' expected", c));
  }
  bool take_word(std::string_view word) {
    if (text_.substr(at_, word.size()) != word) return false;
    at_ += word.size();
    return true;
  }

  json_value value() {
    skip_space();
    if (at_ >= text_.size()) fail("value expected");
    json_value v;
    const char c = text_[at_];
    if (c == '{') {
      v.type = json_value::kind::object;
      ++at_;
      if (take('}')) return v;
      do {
        skip_space();
        std::string key = string();
        expect(':');
        v.members.emplace_back(std::move(key), value());
      } while (take(','));
      expect('}');
    } else if (c == '[') {
      v.type = json_value::kind::array;
      ++at_;
      if (take(']')) return v;
      do v.items.push_back(value());
      while (take(','));
      expect(']');
    } else if (c == '"') {
      v.type = json_value::kind::string;
      v.text = string();
    } else if (take_word("true") || take_word("false")) {
      v.type = json_value::kind::boolean;
      v.boolean = c == 't';
    } else if (take_word("null")) {
      v.type = json_value::kind::null;
    } else {
      v.type = json_value::kind::number;
      const char* const begin = text_.data() + at_;
      const auto [end, ec] = std::from_chars(begin, text_.data() + text_.size(), v.number);
      if (ec != std::errc{}) fail("number expected");
      at_ += static_cast<std::size_t>(end - begin);
    }
    return v;
  }

  std::string string() {
    if (at_ >= text_.size() || text_[at_] != '"') fail("string expected");
    ++at_;
    std::string out;
    while (true) {
      if (at_ >= text_.size()) fail("unterminated string");
      const char c = text_[at_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= text_.size()) fail("unterminated escape");
      const char e = text_[at_++];
      switch (e) {
        case '"':
        case '\\':
        case '/': out += e; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned code = 0;
          const auto [end, ec] =
              std::from_chars(text_.data() + at_, text_.data() + std::min(at_ + 4, text_.size()), code, 16);
          if (ec != std::errc{} || end != text_.data() + at_ + 4) fail("bad \\u escape");
          at_ += 4;
          if (code < 0x80) {  // UTF-8 of a basic-plane code point (surrogates are kept as they come)
            out += static_cast<char>(code);
          } else if (code < 0x800) {
            out += static_cast<char>(0xC0 | (code >> 6));
            out += static_cast<char>(0x80 | (code & 0x3F));
          } else {
            out += static_cast<char>(0xE0 | (code >> 12));
            out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (code & 0x3F));
          }
          break;
        }
        default: fail("bad escape");
      }
    }
  }

  std::string_view text_;
  std::size_t at_ = 0;
};

/// The records (an array of objects) of a bench JSON file.
inline std::vector<json_value> read_records(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("cannot open '" + path + "'");
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  json_value root;
  try {
    root = json_parser(text).parse();
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
  if (root.type != json_value::kind::array) throw std::runtime_error(path + ": not a JSON array of bench records");
  for (const json_value& r : root.items)
    if (r.type != json_value::kind::object || r.find("name") == nullptr || !r.number_at("n"))
      throw std::runtime_error(path + ": an element is not a bench record (an object with name and n)");
  return std::move(root.items);
}

inline std::string join(const std::vector<std::string>& parts, std::string_view separator) {
  std::string out;
  for (const std::string& part : parts) out += (out.empty() ? "" : std::string(separator)) + part;
  return out;
}

/// One line about the run of a file's first record.
inline std::string describe_recorded_run(const std::vector<json_value>& records) {
  const json_value* run = records.empty() ? nullptr : records.front().find("run");
  if (run == nullptr) return "machine and build not recorded (a file from before they were)";
  return fmt::format("{}, {} logical CPUs, {}, flags \"{}\", gradcomp {} at {}", run->string_or("cpu", "?"),
                     run->number_at("logical_cpus").value_or(0.0), run->string_or("compiler", "?"),
                     run->string_or("flags", "?"), run->string_or("version", "?"), run->string_or("commit", "?"));
}

/// Prints, for every record (name, n, backend, device) in both files, ratio_to_copy in A and in B
/// and its change, after a line on each file's run and a warning where machine or build differ;
/// then the records found in one file only.
inline void compare_files(const std::string& path_a, const std::string& path_b) {
  const std::vector<json_value> a = read_records(path_a);
  const std::vector<json_value> b = read_records(path_b);
  fmt::print("A: {}: {}\nB: {}: {}\n", path_a, describe_recorded_run(a), path_b, describe_recorded_run(b));
  if (!a.empty() && !b.empty()) {
    const json_value* run_a = a.front().find("run");
    const json_value* run_b = b.front().find("run");
    std::vector<std::string> differing;
    for (const std::string_view field : {"cpu", "logical_cpus", "compiler", "flags"}) {
      const json_value* x = run_a != nullptr ? run_a->find(field) : nullptr;
      const json_value* y = run_b != nullptr ? run_b->find(field) : nullptr;
      const bool same =
          x != nullptr && y != nullptr && x->type == y->type && x->text == y->text && x->number == y->number;
      if (!same) differing.emplace_back(field);
    }
    if (!differing.empty())
      fmt::print(
          "note: the runs differ in {} (or do not say): ratios to each run's own copy compare best, but "
          "read the changes with that in mind\n",
          join(differing, ", "));
  }
  const auto key = [](const json_value& r) {
    return fmt::format("{}|{}|{}|{}", r.string_or("name", ""), r.number_at("n").value_or(0.0),
                       r.string_or("backend", ""), r.string_or("device", ""));
  };
  constexpr std::string_view row = "{:<24} {:<7} {:>10} {:>10} {:>10} {:>9}\n";
  fmt::print("\n");
  fmt::print(fmt::runtime(row), "name", "backend", "n", "A x copy", "B x copy", "change");
  std::vector<bool> matched(b.size(), false);
  std::vector<std::string> only_a;
  for (const json_value& ra : a) {
    std::size_t j = 0;
    while (j < b.size() && (matched[j] || key(b[j]) != key(ra))) ++j;
    if (j == b.size()) {
      only_a.push_back(fmt::format("{} n={}", ra.string_or("name", "?"), ra.number_at("n").value_or(0.0)));
      continue;
    }
    matched[j] = true;
    const std::optional<double> x = ra.number_at("ratio_to_copy");
    const std::optional<double> y = b[j].number_at("ratio_to_copy");
    const std::string change = x && y && *x > 0.0 ? fmt::format("{:+.1f}%", (*y / *x - 1.0) * 100.0) : std::string("-");
    fmt::print(fmt::runtime(row), ra.string_or("name", "?"), ra.string_or("backend", "?"),
               ra.number_at("n").value_or(0.0), optional_text(x, "{:.3f}"), optional_text(y, "{:.3f}"), change);
  }
  std::vector<std::string> only_b;
  for (std::size_t j = 0; j < b.size(); ++j)
    if (!matched[j])
      only_b.push_back(fmt::format("{} n={}", b[j].string_or("name", "?"), b[j].number_at("n").value_or(0.0)));
  if (!only_a.empty()) fmt::print("\nonly in A: {}\n", join(only_a, ", "));
  if (!only_b.empty()) fmt::print("\nonly in B: {}\n", join(only_b, ", "));
}

}  // namespace gradcomp_bench
