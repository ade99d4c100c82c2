#pragma once
// What gradcomp-bench (CPU) and gradcomp-bench-cuda share: option parsing, the seeded N(0, σ)
// gradient, the checksum that keeps timed work observable, the record of one measurement and its
// ratio to the same run's copy, the table, the PASS/FAIL lines and the JSON file.
#include <fmt/core.h>
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
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

  [[nodiscard]] double dense_bytes() const noexcept { return static_cast<double>(n) * sizeof(float); }
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

// ---- output ------------------------------------------------------------------------------------

inline std::string optional_text(const std::optional<double>& v, std::string_view spec) {
  return v ? fmt::format(fmt::runtime(spec), *v) : std::string("-");
}

inline void print_table(const std::vector<record>& records, std::string_view backend) {
  constexpr std::string_view row = "{:<20} {:<7} {:>10} {:>10} {:>10} {:>9} {:>9} {:>8} {:>9} {:<19} {:>8} {:>9}\n";
  fmt::print(fmt::runtime(row), "name", "backend", "n", "best ms", "median ms", "grad GB/s", "copy GB/s",
             "x copy", "compress", "baseline", "speedup", "density");
  fmt::print("{}\n", std::string(20 + 7 + 10 + 10 + 10 + 9 + 9 + 8 + 9 + 19 + 8 + 9 + 11, '-'));
  std::uint64_t last_n = 0;
  for (const record& r : records) {
    if (last_n != 0 && r.n != last_n) fmt::print("\n");
    last_n = r.n;
    fmt::print(fmt::runtime(row), r.name, backend, r.n, fmt::format("{:.3f}", r.time.best * 1e3),
               fmt::format("{:.3f}", r.time.median * 1e3), fmt::format("{:.2f}", r.gradient_gbps()),
               fmt::format("{:.2f}", r.copy_gbps()), fmt::format("{:.3f}", r.ratio_to_copy()),
               fmt::format("{:.1f}", r.compression_ratio), r.baseline.empty() ? std::string("-") : r.baseline,
               optional_text(r.speedup, "{:.2f}"), optional_text(r.achieved_density, "{:.5f}"));
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
  else s += "null";
}

inline std::string to_json(const std::vector<record>& records, std::string_view backend, std::string_view device) {
  std::string s = "[\n";
  for (std::size_t i = 0; i < records.size(); ++i) {
    const record& r = records[i];
    s += "  {\"name\": ";
    append_json_string(s, r.name);
    s += ", \"backend\": ";
    append_json_string(s, backend);
    if (!device.empty()) {
      s += ", \"device\": ";
      append_json_string(s, device);
    }
    fmt::format_to(std::back_inserter(s), ", \"n\": {}", r.n);
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

}  // namespace gradcomp_bench
