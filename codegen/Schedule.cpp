// scheduleForCpu and scheduleForCuda (Schedule.h).
#include "codegen/Schedule.h"

#include <functional>

namespace kiln::codegen {

void scheduleForCpu(kir::Kernel& kernel) {
  kir::Schedule schedule;
  schedule.target = "cpu";
  bool threads = false;
  std::function<void(const std::vector<kir::StmtPtr>&)> visit = [&](const std::vector<kir::StmtPtr>& body) {
    for (const kir::StmtPtr& s : body) {
      if (s->kind != kir::Stmt::Kind::For) continue;
      if (s->parallel && !threads) {
        schedule.loops.emplace_back(s->var, kir::LoopMapping::Threads);
        threads = true;
      } else if (s->vectorize) {
        schedule.loops.emplace_back(s->var, kir::LoopMapping::Vector);
      }
      visit(s->body);
    }
  };
  visit(kernel.body);
  kernel.schedule = std::move(schedule);
}

void scheduleForCuda(kir::Kernel& kernel) {
  kir::Schedule schedule;
  schedule.target = "cuda";
  schedule.blockSize = 256;
  // The kernel's one parallel loop, and the loops perfectly nested in it
  // that are independent too.
  for (const kir::StmtPtr& s : kernel.body) {
    if (s->kind != kir::Stmt::Kind::For || !s->parallel) continue;
    const kir::Stmt* loop = s.get();
    schedule.loops.emplace_back(loop->var, kir::LoopMapping::Grid);
    while (loop->body.size() == 1 && loop->body[0]->kind == kir::Stmt::Kind::For &&
           (loop->body[0]->parallel || loop->body[0]->vectorize)) {
      loop = loop->body[0].get();
      schedule.loops.emplace_back(loop->var, kir::LoopMapping::Grid);
    }
    break;
  }
  kernel.schedule = std::move(schedule);
}

void scheduleFor(std::string_view target, kir::Kernel& kernel) {
  if (target == "cuda")
    scheduleForCuda(kernel);
  else
    scheduleForCpu(kernel);
}

}  // namespace kiln::codegen
