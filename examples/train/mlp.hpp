#pragma once
// A 2-layer perceptron (inputs -> hidden ReLU -> softmax over classes) whose parameters, and hence
// whose gradient, are one flat float vector: the single bucket each worker compresses.
//
// Layout of the flat vector: W1 [inputs][hidden] (input-major, so the forward and backward passes
// are axpy loops the compiler vectorises), b1 [hidden], W2 [classes][hidden], b2 [classes].
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string_view>
#include <vector>

#include "data.hpp"

namespace train {

/// One parameter tensor inside the flat parameter (and gradient) vector.
struct parameter {
  std::string_view name;  ///< Named as PyTorch would name it.
  std::size_t offset;     ///< First element in the flat vector.
  std::size_t rows;       ///< Outer dimension (1 for a bias).
  std::size_t cols;       ///< Inner dimension.
  [[nodiscard]] std::size_t size() const noexcept { return rows * cols; }
};

struct evaluation {
  double loss = 0.0;
  double accuracy = 0.0;
};

class mlp {
 public:
  mlp(std::size_t inputs, std::size_t hidden, std::size_t classes)
      : in_(inputs), hid_(hidden), out_(classes), params_(inputs * hidden + hidden + classes * hidden + classes) {}

  [[nodiscard]] std::size_t size() const noexcept { return params_.size(); }
  [[nodiscard]] std::span<const float> params() const noexcept { return params_; }

  /// The parameter tensors, in the order of the flat vector.
  [[nodiscard]] std::vector<parameter> layout() const {
    return {{"fc1.weight", w1(), in_, hid_},
            {"fc1.bias", b1(), 1, hid_},
            {"fc2.weight", w2(), out_, hid_},
            {"fc2.bias", b2(), 1, out_}};
  }

  /// He initialisation of the weights, zero biases.
  void init(rng& r) {
    std::fill(params_.begin(), params_.end(), 0.0f);
    const double s1 = std::sqrt(2.0 / static_cast<double>(in_));
    const double s2 = std::sqrt(2.0 / static_cast<double>(hid_));
    for (std::size_t i = 0; i < in_ * hid_; ++i) params_[w1() + i] = static_cast<float>(s1 * r.normal());
    for (std::size_t i = 0; i < out_ * hid_; ++i) params_[w2() + i] = static_cast<float>(s2 * r.normal());
  }

  /// params -= lr * step.
  void sgd(std::span<const float> step, float lr) {
    for (std::size_t i = 0; i < params_.size(); ++i) params_[i] -= lr * step[i];
  }

  /// Mean softmax cross-entropy over the samples `batch` of `data`; writes its gradient into
  /// `grad` (size() floats, overwritten) and returns the loss.
  double gradient(const dataset& data, std::span<const std::size_t> batch, std::span<float> grad) const {
    std::fill(grad.begin(), grad.end(), 0.0f);
    std::vector<float> h(hid_), dh(hid_), p(out_);
    const float inv_batch = 1.0f / static_cast<float>(batch.size());
    double loss = 0.0;
    for (const std::size_t s : batch) {
      const float* x = data.row(s);
      forward(x, h, p);
      const auto label = static_cast<std::size_t>(data.labels[s]);
      loss -= std::log(std::max(static_cast<double>(p[label]), 1e-30));
      // dlogits = (p - onehot) / batch, stored in p.
      for (std::size_t c = 0; c < out_; ++c) p[c] = (p[c] - (c == label ? 1.0f : 0.0f)) * inv_batch;
      std::fill(dh.begin(), dh.end(), 0.0f);
      for (std::size_t c = 0; c < out_; ++c) {
        const float* w = params_.data() + w2() + c * hid_;
        float* gw = grad.data() + w2() + c * hid_;
        for (std::size_t j = 0; j < hid_; ++j) {
          gw[j] += p[c] * h[j];
          dh[j] += p[c] * w[j];
        }
        grad[b2() + c] += p[c];
      }
      for (std::size_t j = 0; j < hid_; ++j) {
        if (h[j] <= 0.0f) dh[j] = 0.0f;
        grad[b1() + j] += dh[j];
      }
      for (std::size_t i = 0; i < in_; ++i) {
        float* gw = grad.data() + w1() + i * hid_;
        for (std::size_t j = 0; j < hid_; ++j) gw[j] += x[i] * dh[j];
      }
    }
    return loss / static_cast<double>(batch.size());
  }

  /// Mean loss and accuracy over all of `data`.
  [[nodiscard]] evaluation evaluate(const dataset& data) const {
    std::vector<float> h(hid_), p(out_);
    evaluation e;
    std::size_t correct = 0;
    for (std::size_t s = 0; s < data.size(); ++s) {
      forward(data.row(s), h, p);
      const auto label = static_cast<std::size_t>(data.labels[s]);
      e.loss -= std::log(std::max(static_cast<double>(p[label]), 1e-30));
      if (static_cast<std::size_t>(std::max_element(p.begin(), p.end()) - p.begin()) == label) ++correct;
    }
    e.loss /= static_cast<double>(data.size());
    e.accuracy = static_cast<double>(correct) / static_cast<double>(data.size());
    return e;
  }

 private:
  [[nodiscard]] std::size_t w1() const noexcept { return 0; }
  [[nodiscard]] std::size_t b1() const noexcept { return in_ * hid_; }
  [[nodiscard]] std::size_t w2() const noexcept { return b1() + hid_; }
  [[nodiscard]] std::size_t b2() const noexcept { return w2() + out_ * hid_; }

  /// h = relu(x W1 + b1), p = softmax(W2 h + b2).
  void forward(const float* x, std::vector<float>& h, std::vector<float>& p) const {
    std::copy_n(params_.data() + b1(), hid_, h.begin());
    for (std::size_t i = 0; i < in_; ++i) {
      const float* w = params_.data() + w1() + i * hid_;
      for (std::size_t j = 0; j < hid_; ++j) h[j] += x[i] * w[j];
    }
    for (float& v : h) v = std::max(v, 0.0f);
    float top = std::numeric_limits<float>::lowest();
    for (std::size_t c = 0; c < out_; ++c) {
      const float* w = params_.data() + w2() + c * hid_;
      float z = params_[b2() + c];
      for (std::size_t j = 0; j < hid_; ++j) z += w[j] * h[j];
      p[c] = z;
      top = std::max(top, z);
    }
    float sum = 0.0f;
    for (float& v : p) {
      v = std::exp(v - top);
      sum += v;
    }
    for (float& v : p) v /= sum;
  }

  std::size_t in_, hid_, out_;
  std::vector<float> params_;
};

}  // namespace train
