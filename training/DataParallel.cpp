// A rank's GPU and its message when mpirun ends it (training/DataParallel.h).
#include "training/DataParallel.h"

#include <unistd.h>

#include <csignal>

namespace kiln::training {

Expected<std::optional<std::string>> rankCudaDevice(const std::string& asked, bool emulated, int usableGpus,
                                                    int localRank, int localSize) {
  if (emulated) return std::optional<std::string>();
  if (asked.starts_with("cuda:"))
    return Error("--device " + asked +
                 " names one GPU for every rank; under mpirun give --device cuda, and "
                 "each rank takes the GPU of its local rank");
  if (localSize > usableGpus)
    return Error(std::to_string(localSize) + " ranks run on this machine but it has " + std::to_string(usableGpus) +
                 " usable GPU" + (usableGpus == 1 ? "" : "s") + ": NCCL refuses two ranks on one GPU; start at most " +
                 std::to_string(usableGpus) + " ranks per machine (mpirun --map-by ppr:" + std::to_string(usableGpus) +
                 ":node)");
  return std::optional<std::string>("cuda:" + std::to_string(localRank));
}

namespace {

// What the handler reads: set once before it is installed.
const char* gPrefix = "";
int gRank = 0, gWorld = 1, gExitStatus = 1;
const std::atomic<int64_t>* gStep = nullptr;

void onTerminate(int) {
  char text[192];
  char number[24];
  auto put = [&](size_t& at, const char* s) {
    while (*s && at + 1 < sizeof text) text[at++] = *s++;
  };
  auto putInt = [&](size_t& at, int64_t v) {
    int n = 0;
    if (v == 0) number[n++] = '0';
    while (v > 0 && n < 20) {
      number[n++] = static_cast<char>('0' + v % 10);
      v /= 10;
    }
    while (n > 0 && at + 1 < sizeof text) text[at++] = number[--n];
  };
  size_t at = 0;
  put(at, gPrefix);
  put(at, ": rank ");
  putInt(at, gRank);
  put(at, " of ");
  putInt(at, gWorld);
  put(at, ": stopped at step ");
  putInt(at, gStep->load() + 1);
  put(at, ": mpirun ended the job (another rank died or failed; mpirun's message names it)\n");
  [[maybe_unused]] ssize_t written = write(2, text, at);
  _exit(gExitStatus);
}

}  // namespace

void reportTerminationOnSigterm(const char* prefix, int rank, int world, const std::atomic<int64_t>& step,
                                int exitStatus) {
  gPrefix = prefix;
  gRank = rank;
  gWorld = world;
  gStep = &step;
  gExitStatus = exitStatus;
  std::signal(SIGTERM, onTerminate);
}

}  // namespace kiln::training
