// Collectives (runtime/Collectives.h) and data-parallel training steps
// without MPI: ranks as threads of this process, each with its own
// communicator (ScopedThreadCommunicator) joined through a ThreadGroup; and
// a recording transport that shows when a training step issues and waits
// for its gradient buckets. The mpirun tests (test/distributed/) run the
// same code over Open MPI.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "driver/Session.h"
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "passes/Autodiff.h"
#include "passes/TrainingStep.h"
#include "runtime/Collectives.h"
#include "runtime/Interpreter.h"
#include "training/Data.h"
#include "training/Step.h"

namespace kiln::test {
namespace {

/// `size` ranks as threads: each collective is an exchange in which every
/// rank deposits its buffer and, once all have, computes its result from
/// all of them.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), deposits_(static_cast<size_t>(size)) {}
  int size() const { return size_; }

  /// Deposits `bytes` for `rank`, waits for every rank, runs `use` on all
  /// deposits, and waits again so that no deposit is overwritten early.
  void exchange(int rank, const void* data, size_t bytes,
                const std::function<void(const std::vector<std::vector<uint8_t>>&)>& use) {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t round = round_;
    deposits_[static_cast<size_t>(rank)].assign(static_cast<const uint8_t*>(data),
                                                 static_cast<const uint8_t*>(data) + bytes);
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return round_ != round; });
    }
    use(deposits_);
    if (++left_ == size_) {
      left_ = 0;
      ++leftRound_;
      cv_.notify_all();
    } else {
      const uint64_t leaving = leftRound_;
      cv_.wait(lock, [&] { return leftRound_ != leaving; });
    }
  }

 private:
  int size_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::vector<uint8_t>> deposits_;
  int arrived_ = 0, left_ = 0;
  uint64_t round_ = 0, leftRound_ = 0;
};

/// Sums (or averages) `count` values of `dtype` from each deposit's
/// `offset` on into `out`.
void reduceInto(void* out, const std::vector<std::vector<uint8_t>>& all, size_t offset, int64_t count, DType dtype,
                ReduceKind kind) {
  for (int64_t i = 0; i < count; ++i) {
    double sum = 0;
    for (const auto& d : all) {
      if (dtype == DType::F32) sum += reinterpret_cast<const float*>(d.data() + offset)[i];
      if (dtype == DType::F64) sum += reinterpret_cast<const double*>(d.data() + offset)[i];
      if (dtype == DType::I64) sum += static_cast<double>(reinterpret_cast<const int64_t*>(d.data() + offset)[i]);
    }
    if (kind == ReduceKind::Mean) sum /= static_cast<double>(all.size());
    if (dtype == DType::F32) static_cast<float*>(out)[i] = static_cast<float>(sum);
    if (dtype == DType::F64) static_cast<double*>(out)[i] = sum;
    if (dtype == DType::I64) static_cast<int64_t*>(out)[i] = static_cast<int64_t>(sum);
  }
}

class ThreadRank final : public Communicator {
 public:
  ThreadRank(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }
  std::string name() const override { return "threads"; }
  Expected<std::unique_ptr<CollectiveRequest>> startAllReduce(void* data, int64_t count, DType dtype, ReduceKind kind,
                                                              const std::string&) override {
    group_.exchange(rank_, data, static_cast<size_t>(count) * dtypeSize(dtype),
                    [&](const auto& all) { reduceInto(data, all, 0, count, dtype, kind); });
    return completedRequest();
  }
  Expected<std::unique_ptr<CollectiveRequest>> startBroadcast(void* data, int64_t bytes, int root,
                                                              const std::string&) override {
    group_.exchange(rank_, data, static_cast<size_t>(bytes),
                    [&](const auto& all) { std::memcpy(data, all[static_cast<size_t>(root)].data(), bytes); });
    return completedRequest();
  }
  Expected<std::unique_ptr<CollectiveRequest>> startReduce(void* data, int64_t count, DType dtype, ReduceKind kind,
                                                           int root, const std::string&) override {
    const size_t bytes = static_cast<size_t>(count) * dtypeSize(dtype);
    group_.exchange(rank_, data, bytes, [&](const auto& all) {
      if (rank_ == root)
        reduceInto(data, all, 0, count, dtype, kind);
      else
        std::memset(data, 0, bytes);
    });
    return completedRequest();
  }
  Expected<std::unique_ptr<CollectiveRequest>> startAllGather(const void* in, void* out, int64_t bytes,
                                                              const std::string&) override {
    group_.exchange(rank_, in, static_cast<size_t>(bytes), [&](const auto& all) {
      for (size_t r = 0; r < all.size(); ++r)
        std::memcpy(static_cast<uint8_t*>(out) + r * static_cast<size_t>(bytes), all[r].data(), bytes);
    });
    return completedRequest();
  }
  Expected<std::unique_ptr<CollectiveRequest>> startReduceScatter(const void* in, void* out, int64_t count,
                                                                  DType dtype, ReduceKind kind,
                                                                  const std::string&) override {
    const size_t block = static_cast<size_t>(count) * dtypeSize(dtype);
    group_.exchange(rank_, in, block * static_cast<size_t>(group_.size()), [&](const auto& all) {
      reduceInto(out, all, block * static_cast<size_t>(rank_), count, dtype, kind);
    });
    return completedRequest();
  }

 private:
  ThreadGroup& group_;
  int rank_;
};

/// Runs `body(rank)` on `size` threads, each the rank of one group.
void onRanks(int size, const std::function<void(int)>& body) {
  ThreadGroup group(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      ThreadRank rank(group, r);
      ScopedThreadCommunicator scoped(rank);
      body(r);
    });
  for (std::thread& t : threads) t.join();
}

std::unique_ptr<Module> parse(const std::string& text) {
  auto m = parseModule(text, "collectives-test.kir");
  EXPECT_TRUE(m) << (m ? "" : m.error().str());
  return m ? std::move(*m) : nullptr;
}

Tensor f32(std::vector<int64_t> dims, std::vector<float> values) {
  Tensor t(DType::F32, std::move(dims));
  std::memcpy(t.raw(), values.data(), values.size() * sizeof(float));
  return t;
}

std::vector<float> valuesOf(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numElements()));
  std::memcpy(v.data(), t.raw(), v.size() * sizeof(float));
  return v;
}

constexpr const char* kEveryCollective = R"(
func @c(%x: f32[2,2]) -> (f32[2,2], f32[2,2], f32[2,2], f32[4,2], f32[2,4], f32[1,2], f32[2,2]) {
  %sum = all_reduce(%x) {reduction = "sum"} : f32[2,2]
  %mean = all_reduce(%x) {reduction = "mean"} : f32[2,2]
  %b = broadcast_from(%x) {root = 1} : f32[2,2]
  %g0 = all_gather(%x) {axis = 0, world_size = 2} : f32[4,2]
  %g1 = all_gather(%x) {axis = 1, world_size = 2} : f32[2,4]
  %rs = reduce_scatter(%x) {axis = 0, world_size = 2, reduction = "sum"} : f32[1,2]
  %r = reduce_to(%x) {root = 0, reduction = "sum"} : f32[2,2]
  return %sum, %mean, %b, %g0, %g1, %rs, %r
}
)";

/// Rank r's x: [[1, 2], [3, 4]] + 10 r.
Tensor rankInput(int r) {
  const float o = 10.0f * static_cast<float>(r);
  return f32({2, 2}, {1 + o, 2 + o, 3 + o, 4 + o});
}

void expectEveryCollective(int r, const std::vector<Tensor>& out) {
  ASSERT_EQ(out.size(), 7u);
  EXPECT_EQ(valuesOf(out[0]), (std::vector<float>{12, 14, 16, 18}));
  EXPECT_EQ(valuesOf(out[1]), (std::vector<float>{6, 7, 8, 9}));
  EXPECT_EQ(valuesOf(out[2]), (std::vector<float>{11, 12, 13, 14}));
  EXPECT_EQ(valuesOf(out[3]), (std::vector<float>{1, 2, 3, 4, 11, 12, 13, 14}));
  EXPECT_EQ(valuesOf(out[4]), (std::vector<float>{1, 2, 11, 12, 3, 4, 13, 14}));
  // Rank r's block of the sum along dim 0.
  EXPECT_EQ(valuesOf(out[5]), r == 0 ? (std::vector<float>{12, 14}) : (std::vector<float>{16, 18}));
  EXPECT_EQ(valuesOf(out[6]), r == 0 ? (std::vector<float>{12, 14, 16, 18}) : (std::vector<float>{0, 0, 0, 0}));
}

TEST(CollectivesTest, InterpreterRunsEachCollectiveAcrossTwoRanks) {
  auto m = parse(kEveryCollective);
  ASSERT_TRUE(m);
  onRanks(2, [&](int r) {
    auto out = interpret(*m->functions().front(), {rankInput(r)});
    ASSERT_TRUE(out) << out.error().str();
    expectEveryCollective(r, *out);
  });
}

TEST(CollectivesTest, CompiledProgramsRunTheCollectivesAsTheInterpreterDoes) {
  auto m = parse(kEveryCollective);
  ASSERT_TRUE(m);
  onRanks(2, [&](int r) {
    auto session = std::get<std::unique_ptr<Session>>(Session::create({.allowFallback = false}));
    auto model = session->compile(*m->functions().front());
    ASSERT_TRUE(model) << model.error().str();
    auto out = (*model)->run({rankInput(r)});
    ASSERT_TRUE(out) << out.error().str();
    EXPECT_FALSE((*model)->interpreted());
    expectEveryCollective(r, *out);
  });
}

TEST(CollectivesTest, OneProcessIsRankZeroOfOne) {
  EXPECT_EQ(communicator().size(), 1);
  auto m = parse(R"(
func @c(%x: f32[3]) -> (f32[3], f32[3], f32[3], f32[3], f32[3]) {
  %a = all_reduce(%x) {reduction = "mean"} : f32[3]
  %b = broadcast_from(%x) {root = 0} : f32[3]
  %r = reduce_to(%x) {root = 0} : f32[3]
  %g = all_gather(%x) {axis = 0, world_size = 1} : f32[3]
  %s = reduce_scatter(%x) {axis = 0, world_size = 1} : f32[3]
  return %a, %b, %r, %g, %s
}
)");
  ASSERT_TRUE(m);
  auto out = interpret(*m->functions().front(), {f32({3}, {1, -2, 3})});
  ASSERT_TRUE(out) << out.error().str();
  for (const Tensor& t : *out) EXPECT_EQ(valuesOf(t), (std::vector<float>{1, -2, 3}));
  // A gather made for 2 ranks does not run in a job of 1.
  auto two = parse("func @g(%x: f32[3]) -> f32[6] {\n  %g = all_gather(%x) {axis = 0, world_size = 2} : f32[6]\n"
                   "  return %g\n}\n");
  auto failed = interpret(*two->functions().front(), {f32({3}, {1, 2, 3})});
  ASSERT_FALSE(failed);
  EXPECT_NE(failed.error().message().find("was compiled for 2 ranks, but the job has 1 (single process)"),
            std::string::npos)
      << failed.error().message();
}

TEST(CollectivesTest, ShapeRulesCheckTheirAttributes) {
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"%y = reduce_scatter(%x) {axis = 0, world_size = 2} : f32[1]", "must divide evenly"},
           {"%y = all_reduce(%x) {reduction = \"max\"} : f32[3]", "expected sum or mean"},
           {"%y = all_gather(%x) {axis = 2, world_size = 2} : f32[6]", "out of range"},
           {"%y = all_gather(%x) {axis = 0, world_size = 0} : f32[0]", "at least 1"}}) {
    auto m = parseModule("func @f(%x: f32[3]) -> f32[1] {\n  " + text + "\n  return %y\n}\n", "t.kir");
    std::string message = m ? (verify(**m) ? std::string("verified") : verify(**m).error().message())
                            : m.error().message();
    EXPECT_NE(message.find(why), std::string::npos) << text << ": " << message;
  }
}

/// The job's loss is the sum of every rank's: each collective's VJP must
/// match central differences of that sum, taken by perturbing one rank's
/// input at a time while both ranks run the forward function.
TEST(CollectivesTest, VjpsMatchFiniteDifferencesOfTheJobsLoss) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"%y = all_reduce(%x) {reduction = \"sum\"} : f64[2,3]", "f64[2,3]"},
      {"%y = all_reduce(%x) {reduction = \"mean\"} : f64[2,3]", "f64[2,3]"},
      {"%y = broadcast_from(%x) {root = 1} : f64[2,3]", "f64[2,3]"},
      {"%y = reduce_to(%x) {root = 0, reduction = \"sum\"} : f64[2,3]", "f64[2,3]"},
      {"%y = reduce_to(%x) {root = 1, reduction = \"mean\"} : f64[2,3]", "f64[2,3]"},
      {"%y = all_gather(%x) {axis = 1, world_size = 2} : f64[2,6]", "f64[2,6]"},
      {"%y = reduce_scatter(%x) {axis = 0, world_size = 2, reduction = \"sum\"} : f64[1,3]", "f64[1,3]"},
      {"%y = reduce_scatter(%x) {axis = 0, world_size = 2, reduction = \"mean\"} : f64[1,3]", "f64[1,3]"},
  };
  for (const auto& [body, outType] : cases) {
    SCOPED_TRACE(body);
    // loss_r = sum(tanh(y) * proj_r), a different projection on each rank.
    const std::string text = "func @f(%x: f64[2,3] = dense<f64[2,3]>[0.0, 0.0, 0.0, 0.0, 0.0, 0.0], %proj: " +
                             outType + ") -> f64[] {\n  " + body + "\n  %t = tanh(%y) : " + outType +
                             "\n  %p = mul(%t, %proj) : " + outType +
                             "\n  %l = reduce_sum(%p) {axes = []} : f64[]\n  return %l\n}\n";
    auto forward = parse(text);
    auto backward = parse(text);
    ASSERT_TRUE(forward && backward);
    ASSERT_TRUE(differentiateFunction(*backward->functions().front(), AutodiffOptions{std::vector<std::string>{"x"}, 0}));
    const Function& f = *forward->functions().front();
    const Function& g = *backward->functions().front();
    const std::vector<int64_t> outDims = staticDims(g.argument(1)->type().shape);
    std::vector<Tensor> xs(2), projs(2);
    std::mt19937 rng(3);
    for (int r = 0; r < 2; ++r) {
      xs[r] = Tensor(DType::F64, {2, 3});
      projs[r] = Tensor(DType::F64, outDims);
      for (int64_t i = 0; i < 6; ++i) xs[r].setDouble(i, std::uniform_real_distribution<double>(-1, 1)(rng));
      for (int64_t i = 0; i < projs[r].numElements(); ++i)
        projs[r].setDouble(i, std::uniform_real_distribution<double>(-1, 1)(rng));
    }
    std::vector<Tensor> grads(2);
    onRanks(2, [&](int r) {
      auto out = interpret(g, {xs[r], projs[r]});
      ASSERT_TRUE(out) << out.error().str();
      grads[r] = (*out)[1];
    });
    auto jobLoss = [&](const std::vector<Tensor>& inputs) {
      double losses[2] = {0, 0};
      onRanks(2, [&](int r) {
        auto out = interpret(f, {inputs[r], projs[r]});
        ASSERT_TRUE(out) << out.error().str();
        losses[r] = (*out)[0].getDouble(0);
      });
      return losses[0] + losses[1];
    };
    for (int r = 0; r < 2; ++r)
      for (int64_t i = 0; i < 6; ++i) {
        const double h = 1e-6;
        std::vector<Tensor> plus = xs, minus = xs;
        plus[r].setDouble(i, xs[r].getDouble(i) + h);
        minus[r].setDouble(i, xs[r].getDouble(i) - h);
        const double fd = (jobLoss(plus) - jobLoss(minus)) / (2 * h);
        EXPECT_NEAR(grads[r].getDouble(i), fd, 1e-6 * (0.1 + std::abs(fd))) << "rank " << r << ", x[" << i << "]";
      }
  }
}

/// A transport for one thread that plays a job of two ranks whose other
/// rank always holds the same values (so a sum doubles), and records when
/// each all-reduce is issued and waited for.
class RecordingTransport final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string name() const override { return "recording"; }
  Expected<std::unique_ptr<CollectiveRequest>> startAllReduce(void* data, int64_t count, DType dtype, ReduceKind kind,
                                                              const std::string& what) override {
    events.push_back("issue " + what);
    class Request final : public CollectiveRequest {
     public:
      Request(RecordingTransport& t, std::string what, void* data, int64_t count, DType dtype, ReduceKind kind)
          : t_(t), what_(std::move(what)), data_(data), count_(count), dtype_(dtype), kind_(kind) {}
      Status wait() override {
        t_.events.push_back("wait " + what_);
        if (kind_ == ReduceKind::Sum && dtype_ == DType::F32)
          for (int64_t i = 0; i < count_; ++i) static_cast<float*>(data_)[i] *= 2;
        return Status();
      }

     private:
      RecordingTransport& t_;
      std::string what_;
      void* data_;
      int64_t count_;
      DType dtype_;
      ReduceKind kind_;
    };
    return std::unique_ptr<CollectiveRequest>(std::make_unique<Request>(*this, what, data, count, dtype, kind));
  }
  Expected<std::unique_ptr<CollectiveRequest>> startBroadcast(void*, int64_t, int, const std::string&) override {
    return completedRequest();
  }
  Expected<std::unique_ptr<CollectiveRequest>> startReduce(void*, int64_t, DType, ReduceKind, int,
                                                           const std::string&) override {
    return completedRequest();
  }
  Expected<std::unique_ptr<CollectiveRequest>> startAllGather(const void*, void*, int64_t,
                                                              const std::string&) override {
    return Error("not recorded");
  }
  Expected<std::unique_ptr<CollectiveRequest>> startReduceScatter(const void*, void*, int64_t, DType, ReduceKind,
                                                                  const std::string&) override {
    return Error("not recorded");
  }
  std::vector<std::string> events;
};

size_t indexOf(const std::vector<std::string>& events, const std::string& prefix) {
  for (size_t i = 0; i < events.size(); ++i)
    if (events[i].rfind(prefix, 0) == 0) return i;
  return events.size();
}

TEST(CollectivesTest, TheFirstBucketIsIssuedBeforeTheBackwardPassEndsAndWaitedForOnlyByTheUpdate) {
  // A 3-layer MLP's training step, data-parallel with buckets of at most
  // 600 bytes: its gradients make several buckets.
  // Weights w[i] = scale * ((i % 7) - 3).
  auto dense = [](std::vector<int64_t> dims, double scale) {
    int64_t n = 1;
    std::string type;
    for (int64_t d : dims) {
      n *= d;
      type += (type.empty() ? "" : ",") + std::to_string(d);
    }
    std::string values;
    for (int64_t i = 0; i < n; ++i)
      values += (i ? ", " : "") + std::to_string(scale * static_cast<double>(i % 7 - 3));
    return "dense<f32[" + type + "]>[" + values + "]";
  };
  auto m = parse("func @mlp(%x: f32[4,16], %w1: f32[16,16] = " + dense({16, 16}, 0.05) +
                 ", %b1: f32[16] = " + dense({16}, 0.01) + ", %w2: f32[16,16] = " + dense({16, 16}, 0.04) +
                 ", %b2: f32[16] = " + dense({16}, 0.01) + ", %w3: f32[16,4] = " + dense({16, 4}, 0.03) +
                 ", %b3: f32[4] = " + dense({4}, 0.01) + R"() -> f32[4,4] {
  %h1 = matmul(%x, %w1) : f32[4,16]
  %a1 = add(%h1, %b1) : f32[4,16]
  %t1 = tanh(%a1) : f32[4,16]
  %h2 = matmul(%t1, %w2) : f32[4,16]
  %a2 = add(%h2, %b2) : f32[4,16]
  %t2 = tanh(%a2) : f32[4,16]
  %h3 = matmul(%t2, %w3) : f32[4,4]
  %o = add(%h3, %b3) : f32[4,4]
  return %o
}
)");
  ASSERT_TRUE(m);
  Function& f = *m->functions().front();
  TrainingStepOptions options;
  options.loss.kind = LossKind::CrossEntropy;
  options.optimizer.kind = OptimizerKind::Sgd;
  options.dataParallel = DataParallelOptions{.bucketCapBytes = 600};
  ASSERT_TRUE(buildTrainingStep(f, options)) << print(f);
  std::vector<std::string> buckets;
  for (const auto& op : f.ops())
    if (op->kind() == OpKind::AllReduce && op->getInt("bucket") >= 0) buckets.push_back(op->result()->name());
  ASSERT_GE(buckets.size(), 3u) << print(f);

  RecordingTransport transport;
  ScopedThreadCommunicator scoped(transport);
  auto session = std::get<std::unique_ptr<Session>>(Session::create({.allowFallback = false}));
  auto model = session->compile(f);
  ASSERT_TRUE(model) << model.error().str();
  training::TrainState state = training::initialState(f);
  training::StepFeed feed;
  Tensor x(DType::F32, {4, 16});
  for (int64_t i = 0; i < x.numElements(); ++i) x.setDouble(i, 0.1 * static_cast<double>(i % 7) - 0.3);
  feed.inputs["x"] = x;
  feed.labels = Tensor(DType::I64, {4});
  for (int64_t i = 0; i < 4; ++i) feed.labels.setInt(i, i % 4);
  feed.lr = Tensor(DType::F32, {});
  feed.lr.setDouble(0, 0.1);
  auto inputs = training::bindStepInputs(f, std::vector<Tensor>(state.values), feed);
  ASSERT_TRUE(inputs) << inputs.error().str();
  auto out = (*model)->run(*inputs);
  ASSERT_TRUE(out) << out.error().str();
  ASSERT_FALSE((*model)->interpreted());

  // Every bucket is issued before the first one is waited for: bucket 0
  // was in flight while the backward kernels producing the later buckets'
  // gradients ran, and only the optimizer update waited for it.
  const auto& events = transport.events;
  std::string log;
  for (const std::string& e : events) log += e + "\n";
  const size_t firstIssue = indexOf(events, "issue all_reduce(sum) %" + buckets.front());
  const size_t lastIssue = indexOf(events, "issue all_reduce(sum) %" + buckets.back());
  const size_t firstWait = indexOf(events, "wait all_reduce(sum) %" + buckets.front());
  ASSERT_LT(firstIssue, events.size()) << log;
  ASSERT_LT(lastIssue, events.size()) << log;
  ASSERT_LT(firstWait, events.size()) << log;
  EXPECT_LT(firstIssue, lastIssue) << log;
  EXPECT_LT(lastIssue, firstWait) << log;
  // In the compiled program, backward kernels run between the first
  // bucket's all-reduce and the last one's.
  codegen::CpuExecutor* executor = (*model)->executor();
  ASSERT_NE(executor, nullptr);
  auto compiled = executor->compiledProgram(*inputs);
  ASSERT_TRUE(compiled) << compiled.error().str();
  const auto& steps = compiled->second->steps;
  size_t first = steps.size(), last = steps.size(), between = 0;
  for (size_t k = 0; k < steps.size(); ++k) {
    if (steps[k].kind == Program::Step::Kind::Collective && steps[k].name == buckets.front()) first = k;
    if (steps[k].kind == Program::Step::Kind::Collective && steps[k].name == buckets.back()) last = k;
  }
  ASSERT_LT(first, last);
  for (size_t k = first + 1; k < last; ++k) between += steps[k].kind != Program::Step::Kind::Collective;
  EXPECT_GT(between, 0u) << log;
}

TEST(CollectivesTest, EachRankTakesItsDistributedSamplerShard) {
  // 10 samples on 3 ranks: the order padded to 12 with its first 2, rank r
  // taking every third from r.
  training::Dataset data;
  data.size = 10;
  data.x = Tensor(DType::I64, {10, 1});
  data.y = Tensor(DType::I64, {10});
  for (int64_t i = 0; i < 10; ++i) data.x.setInt(i, i);
  const std::vector<int64_t> order = training::epochOrder(10, true, 5, 0);
  for (int64_t rank = 0; rank < 3; ++rank) {
    const training::BatchPlan plan = training::BatchPlan::of(10, 2, true, false, 5, rank, 3);
    EXPECT_EQ(plan.shardSize(), 4);
    EXPECT_EQ(plan.stepsPerEpoch, 2);
    training::BatchGatherer gatherer(data, plan);
    std::vector<int64_t> seen;
    for (int64_t step = 0; step < 2; ++step) {
      training::Batch b = gatherer.gather(step);
      for (int64_t i = 0; i < b.x.numElements(); ++i) seen.push_back(b.x.getInt(i));
    }
    std::vector<int64_t> expected;
    for (int64_t j = rank; j < 12; j += 3) expected.push_back(order[static_cast<size_t>(j % 10)]);
    EXPECT_EQ(seen, expected) << "rank " << rank;
  }
}

}  // namespace
}  // namespace kiln::test
