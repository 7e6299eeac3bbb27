#!/usr/bin/env python3
"""Prints the learning rate torch (1.13) uses at each step for the schedules
test/unit/TrainingStepTest.cpp (SchedulesMatchTorchsSchedulers) compares
with: StepLR, LambdaLR with the warm-up + cosine factor of
passes/TrainingStep.h's LrScheduleKind::CosineWarmup, and CosineAnnealingLR.
scheduler.step() follows each optimizer.step(), so entry t is the lr of step
t (0-based). Run with the system python that has torch: /usr/bin/python3."""
import math

import torch


def run(make, steps, base=0.1):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=base)
    sch = make(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sch.step()
    return out


W, T, MIN, BASE = 4, 20, 0.001, 0.1


def warmup_cosine(t):
    if t < W:
        return t / W
    progress = min(1.0, (t - W) / (T - W))
    return (MIN + (BASE - MIN) * 0.5 * (1 + math.cos(math.pi * progress))) / BASE


print("StepLR(step_size=3, gamma=0.5)", run(lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5), 12))
print("LambdaLR(warm-up 4, total 20, min 0.001)", run(lambda o: torch.optim.lr_scheduler.LambdaLR(o, warmup_cosine), 26))
print("CosineAnnealingLR(T_max=16, eta_min=0.001)",
      run(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=T - W, eta_min=MIN), T - W + 1))
