// kiln-every-collective: under `mpirun -np 2`, runs a function with every
// collective op (all_reduce sum and mean, broadcast_from, all_gather along
// dims 0 and 1, reduce_scatter, reduce_to) compiled by a Session on each
// rank, over MPI on the CPU or over NCCL on CUDA, and checks every result
// against what the ops mean (runtime/Collectives.h). Rank r's input is
// [[1, 2], [3, 4]] + 10 r. Exit status 0 and "ok" from rank 0 when all match.
//
//   mpirun -np 2 kiln-every-collective cpu|cuda
#include <cstring>
#include <iostream>
#include <vector>

#include "driver/Session.h"
#include "ir/Parser.h"
#include "runtime/Collectives.h"
#include "runtime/cuda/NcclCollectives.h"
#include "runtime/mpi/MpiCommunicator.h"

using namespace kiln;

namespace {

constexpr const char* kFunction = R"(
func @c(%x: f32[2,2]) -> (f32[2,2], f32[2,2], f32[2,2], f32[4,2], f32[1,2], f32[2,2]) {
  %sum = all_reduce(%x) {reduction = "sum"} : f32[2,2]
  %mean = all_reduce(%x) {reduction = "mean"} : f32[2,2]
  %b = broadcast_from(%x) {root = 1} : f32[2,2]
  %g0 = all_gather(%x) {axis = 0, world_size = 2} : f32[4,2]
  %rs = reduce_scatter(%x) {axis = 0, world_size = 2, reduction = "sum"} : f32[1,2]
  %r = reduce_to(%x) {root = 0, reduction = "sum"} : f32[2,2]
  return %sum, %mean, %b, %g0, %rs, %r
}
)";

int failWith(int rank, const std::string& message) {
  std::cerr << "kiln-every-collective: rank " << rank << ": " << message << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string device = argc > 1 ? argv[1] : "cpu";
  auto mpi = MpiCommunicator::initialize(60);
  if (!mpi) return failWith(-1, mpi.error().message());
  setProcessCommunicator(*mpi);
  const int rank = (*mpi)->rank();
  if ((*mpi)->size() != 2) return failWith(rank, "run me with mpirun -np 2");
  auto module = parseModule(kFunction, "every-collective.kir");
  if (!module) return failWith(rank, module.error().str());
  auto created = Session::create({.device = device, .allowFallback = false});
  if (auto* e = std::get_if<DeviceError>(&created)) return failWith(rank, e->error.message());
  auto session = std::move(std::get<std::unique_ptr<Session>>(created));
  std::shared_ptr<cuda::NcclCommunicator> nccl;
  const bool onCuda = session->device().kind == DeviceChoice::Kind::Cuda;
  if (onCuda) {
    auto context = session->cudaContext();
    if (!context) return failWith(rank, context.error().message());
    auto joined = cuda::NcclCommunicator::create(communicator(), **context);
    if (!joined) return failWith(rank, joined.error().message());
    nccl = *joined;
    cuda::setProcessNccl(nccl);
  }
  int status = 0;
  {
    auto model = session->compile(*(*module)->functions().front());
    if (!model) return failWith(rank, model.error().message());
    Tensor x(DType::F32, {2, 2});
    for (int i = 0; i < 4; ++i) x.setDouble(i, 1 + i + 10 * rank);
    auto out = (*model)->run({x});
    if (!out) return failWith(rank, out.error().message());
    const std::vector<std::vector<float>> expected = {
        {12, 14, 16, 18},
        {6, 7, 8, 9},
        {11, 12, 13, 14},
        {1, 2, 3, 4, 11, 12, 13, 14},
        rank == 0 ? std::vector<float>{12, 14} : std::vector<float>{16, 18},
        rank == 0 ? std::vector<float>{12, 14, 16, 18} : std::vector<float>{0, 0, 0, 0},
    };
    const char* names[] = {"all_reduce(sum)", "all_reduce(mean)", "broadcast_from", "all_gather", "reduce_scatter",
                           "reduce_to"};
    for (size_t k = 0; k < expected.size(); ++k) {
      const Tensor& t = (*out)[k];
      for (int64_t i = 0; i < t.numElements(); ++i)
        if (t.getDouble(i) != expected[k][static_cast<size_t>(i)]) {
          status = failWith(rank, std::string(names[k]) + " on " + device + ": element " + std::to_string(i) + " is " +
                                      std::to_string(t.getDouble(i)) + ", expected " +
                                      std::to_string(expected[k][static_cast<size_t>(i)]));
          break;
        }
    }
    if ((*model)->interpreted()) status = failWith(rank, "the function ran on the interpreter");
  }
  cuda::setProcessNccl(nullptr);
  nccl.reset();
  if (status == 0 && rank == 0)
    std::cout << "ok: every collective on " << device << " over "
              << (onCuda ? std::string("NCCL") : (*mpi)->name()) << "\n";
  setProcessCommunicator(nullptr);
  return status;
}
