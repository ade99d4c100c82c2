#pragma once
// Synthetic classification data for the training demo, reproducible bit for bit on every standard
// library: std::mt19937_64 is fully specified, and the uniform and normal draws are written here
// (std::normal_distribution and std::shuffle are implementation-defined).
//
// Each class is a mixture of a few Gaussian clusters whose centres overlap with other classes'
// clusters, so no linear boundary separates the classes; a fraction of the labels is replaced by
// a random class. The best possible accuracy is therefore well below 100%, and far above chance.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <random>
#include <utility>
#include <vector>

namespace train {

/// Reproducible random numbers.
class rng {
 public:
  explicit rng(std::uint64_t seed) : engine_(seed) {}
  /// Uniform in [0, 1).
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  /// Uniform integer in [0, bound).
  std::size_t below(std::size_t bound) {
    return static_cast<std::size_t>(uniform() * static_cast<double>(bound)) % bound;
  }
  /// Standard normal (Box-Muller, the second value of each pair kept for the next call).
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * std::numbers::pi * u2);
    has_spare_ = true;
    return r * std::cos(2.0 * std::numbers::pi * u2);
  }
  /// Fisher-Yates shuffle.
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }

 private:
  std::mt19937_64 engine_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

/// Row-major samples: features[i * dim + j] is feature j of sample i.
struct dataset {
  std::size_t dim = 0;
  std::vector<float> features;
  std::vector<int> labels;
  [[nodiscard]] std::size_t size() const noexcept { return labels.size(); }
  [[nodiscard]] const float* row(std::size_t i) const noexcept { return features.data() + i * dim; }
};

struct data_config {
  std::size_t dim = 64;
  int classes = 10;
  int clusters_per_class = 3;
  double centre_spread = 0.55;  ///< Standard deviation of the cluster centres, per feature.
  double noise = 1.0;           ///< Standard deviation of a sample around its centre, per feature.
  double label_noise = 0.08;    ///< Probability that a label is replaced by a uniformly drawn class.
  std::uint64_t seed = 2024;
};

/// Draws the cluster centres once, then any number of samples from the same distribution.
class data_generator {
 public:
  explicit data_generator(const data_config& config) : config_(config), rng_(config.seed) {
    const std::size_t centres = static_cast<std::size_t>(config.classes * config.clusters_per_class);
    centres_.resize(centres * config.dim);
    for (double& c : centres_) c = config.centre_spread * rng_.normal();
  }

  dataset sample(std::size_t count) {
    dataset d;
    d.dim = config_.dim;
    d.features.resize(count * config_.dim);
    d.labels.resize(count);
    const auto classes = static_cast<std::size_t>(config_.classes);
    const auto clusters = static_cast<std::size_t>(config_.clusters_per_class);
    for (std::size_t i = 0; i < count; ++i) {
      const std::size_t label = rng_.below(classes);
      const std::size_t centre = label * clusters + rng_.below(clusters);
      for (std::size_t j = 0; j < config_.dim; ++j)
        d.features[i * config_.dim + j] =
            static_cast<float>(centres_[centre * config_.dim + j] + config_.noise * rng_.normal());
      d.labels[i] = static_cast<int>(rng_.uniform() < config_.label_noise ? rng_.below(classes) : label);
    }
    return d;
  }

 private:
  data_config config_;
  rng rng_;
  std::vector<double> centres_;
};

}  // namespace train
