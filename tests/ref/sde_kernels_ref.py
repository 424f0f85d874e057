#!/usr/bin/env python3
"""The SDE kernels of the RL trainers, re-implemented in PyTorch from their
projects' code, applied to what a hi3 trajectory stored.

Sources (the arithmetic, the dtypes and the first/last-step treatment are
taken from these; nothing of them is imported or copied):

  flow-grpo   yifan123/flow_grpo 54809b5, flow_grpo/diffusers_patch/
              sd3_sde_with_logprob.py, sde_step_with_logprob, sde_type "sde";
              the same arithmetic as UniRL's FlowSDEStrategy
              (Tencent-Hunyuan/UniRL 1a7b501, unirl/sde/kernels.py), whose
              _finalize_logp rounds the sample to its storage dtype before the
              log-prob.
  cps         the same function with sde_type "cps"; IamCreateAI/FlowCPS
              b402c7a, flow_grpo/diffusers_patch/sd3_sde_with_logprob.py,
              sde_step_with_logprob (cps only).
  dance-grpo  XueZeyue/DanceGRPO 15cc71d, fastvideo/train_grpo_flux.py,
              flux_step(grpo=True, sde_solver=True), with the -log std -
              log sqrt(2 pi) terms since 9ac72b4.

What each computes, in fp32 unless said (x the sample, v the velocity, s =
sigma, s' = the next sigma, eta the noise level, xi the standard noise):

  flow-grpo  std_t = sqrt(s / (1 - where(s == 1, sigmas[1], s))) * eta
             mean = x * (1 + std_t**2 / (2 s) * dt) + v * (1 + std_t**2 (1 - s) / (2 s)) * dt,
             dt = s' - s; x' = mean + std_t * sqrt(-dt) * xi
             logp = -(x' - mean)**2 / (2 (std_t sqrt(-dt))**2) - log(std_t sqrt(-dt)) - log(sqrt(2 pi))
  cps        std = s' * sin(eta pi / 2) (the sine a Python double)
             mean = (x - s v) (1 - s') + (x + v (1 - s)) sqrt(s'**2 - std**2); x' = mean + std xi
             logp = -(x' - mean)**2 ("all constants removed")
  dance-grpo std = eta * math.sqrt(s - s'): a Python double from the fp32 difference
             mean = x + (s' - s) v + (-0.5 eta**2 score) (s' - s), score = -(x - (x - s v)(1 - s)) / s**2
             x' = mean + xi * std
             logp = -(x' - mean)**2 / (2 std**2) - math.log(std) - log(sqrt(2 pi))
             (the divisor and the log are doubles rounded once to fp32)

and each log-prob is the mean over all but the batch dimension (or, with
--logprob-reduce sum, the sum), torch's fp32 reduction. The sample is
rounded to the latent storage dtype before its log-prob (UniRL's order;
with f32 latents every project's), and guidance is v_u + g (v_c - v_u) in the
trajectory's cfg dtype, as upstream's pipeline (and hi3) combine.

  sde_kernels_ref.py fixture TRAJ OUT
      for every SDE step k of TRAJ (a hi3 trajectory with velocity, from
      diffusion-capture --sampler sde --capture-velocity), from its stored
      latents[:, i], velocity[i], sigmas and sde_noise[:, k]: next (B, K, C,
      h, w) the sample as stored (f32), mean (B, K, C, h, w), logp (B, K)
      torch's fp32 reduction, logp_f64 (B, K) the same fp32 terms reduced in
      double (hi3's reduction); prints how far TRAJ's own latents and
      sde_logp are from them. tests/test-sde.c compares hi3's kernels
      against OUT without Python.
  sde_kernels_ref.py upstream TRAJ
      the same steps through the projects' own functions, taken from the
      git mirrors under UPSTREAM_MIRRORS (one OWNER+NAME/repo each) of UniRL
      (FlowSDEStrategy), FlowCPS (sde_step_with_logprob) and DanceGRPO
      (flux_step), and with FLOW_GRPO_SDE naming a copy of flow_grpo 54809b5's
      sd3_sde_with_logprob.py (snapshots older than sde_type lack the cps
      branch) its sde_step_with_logprob with sde_type "sde" and "cps"; each
      must agree bitwise with this re-implementation (a check of the
      re-implementation, not needed for the fixtures).

Needs a Python with (torch, numpy, safetensors).
"""
import argparse
import ast
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch
from safetensors.numpy import save_file
from safetensors import safe_open

torch.set_num_threads(1)
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
LOG_SQRT_2PI = torch.log(torch.sqrt(2 * torch.as_tensor(math.pi)))  # fp32, as Flow-GRPO and DanceGRPO


def reduce(terms, how):
    dims = tuple(range(1, terms.ndim))
    return terms.sum(dim=dims) if how == "sum" else terms.mean(dim=dims)


def reduce_f64(terms, how):
    dims = tuple(range(1, terms.ndim))
    s = terms.double().sum(dim=dims)
    return s if how == "sum" else s / math.prod(terms.shape[1:])


# ------------------------------------------------------------ the kernels
#
# Each takes the batch x, v (B, C, h, w) fp32, the schedule (a 1-D fp32
# tensor) and the step index, and either draws x' from the given standard
# noise (prev=None) or scores the given x'; it returns (x', mean, terms),
# terms the per-element log-densities before the reduction.

def flow_grpo(x, v, sigmas, i, eta, noise=None, prev=None):
    view = (-1,) + (1,) * (x.ndim - 1)
    s = sigmas[[i] * x.shape[0]].view(view)
    s_next = sigmas[[i + 1] * x.shape[0]].view(view)
    s_max = sigmas[1].item()
    dt = s_next - s
    std_t = torch.sqrt(s / (1 - torch.where(s == 1, s_max, s))) * eta
    mean = x * (1 + std_t ** 2 / (2 * s) * dt) + v * (1 + std_t ** 2 * (1 - s) / (2 * s)) * dt
    if prev is None:
        prev = mean + std_t * torch.sqrt(-1 * dt) * noise
    std = std_t * torch.sqrt(-1 * dt)
    terms = -((prev - mean) ** 2) / (2 * (std ** 2)) - torch.log(std) - LOG_SQRT_2PI
    return prev, mean, terms


def cps(x, v, sigmas, i, eta, noise=None, prev=None):
    view = (-1,) + (1,) * (x.ndim - 1)
    s = sigmas[[i] * x.shape[0]].view(view)
    s_next = sigmas[[i + 1] * x.shape[0]].view(view)
    std = s_next * math.sin(eta * math.pi / 2)
    x0 = x - s * v
    x1 = x + v * (1 - s)
    mean = x0 * (1 - s_next) + x1 * torch.sqrt(s_next ** 2 - std ** 2)
    if prev is None:
        prev = mean + std * noise
    terms = -((prev - mean) ** 2)
    return prev, mean, terms


def dance_grpo(x, v, sigmas, i, eta, noise=None, prev=None):
    s = sigmas[i]
    ds = sigmas[i + 1] - s
    mean = x + ds * v
    x0 = x - s * v
    std = eta * math.sqrt(s - sigmas[i + 1])
    score = -(x - x0 * (1 - s)) / s ** 2
    mean = mean + (-0.5 * eta ** 2 * score) * ds
    if prev is None:
        prev = mean + noise * std
    terms = -((prev.to(torch.float32) - mean.to(torch.float32)) ** 2) / (2 * (std ** 2)) - math.log(std) - LOG_SQRT_2PI
    return prev, mean, terms


KERNELS = {"flow-grpo": flow_grpo, "cps": cps, "dance-grpo": dance_grpo}


# ------------------------------------------------------------ trajectories

def load(path):
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
        t = {k: f.get_tensor(k) for k in f.keys()}
    return meta, t


def guided(vel, i, B, R, g, cfg_dt):
    """v_u + g (v_c - v_u) per request, each operation in the cfg dtype."""
    if R == B or not g > 1.0:
        return vel[i, :B].float()
    c = vel[i, :B].to(cfg_dt)
    u = vel[i, B:2 * B].to(cfg_dt)
    return (u + g * (c - u)).float()


def run(meta, t, kernel_fn=None):
    """(next, mean, logp, logp_f64) of every SDE step of the trajectory."""
    kernel = meta.get("sde_kernel", "flow-grpo")
    how = meta.get("logprob_reduce", "mean")
    eta = float(meta["eta"])
    g = float(meta["guidance"])
    lat_dt = DTYPES[meta["latent_dtype"]]
    cfg_dt = DTYPES[meta.get("cfg_dtype", "f32")]
    fn = kernel_fn or KERNELS[kernel]
    lat, sig, steps, noise, vel = t["latents"], t["sigmas"], t["sde_steps"], t["sde_noise"], t["velocity"]
    B, R = lat.shape[0], vel.shape[1]
    K = steps.shape[0]
    nxt = torch.zeros((B, K) + tuple(lat.shape[2:]))
    mean = torch.zeros_like(nxt)
    lp = torch.zeros((B, K))
    lp64 = torch.zeros((B, K), dtype=torch.float64)
    for k in range(K):
        i = int(steps[k])
        x = lat[:, i].float()
        v = guided(vel, i, B, R, g, cfg_dt)
        prev, _, _ = fn(x, v, sig, i, eta, noise=noise[:, k].float())
        prev = prev.to(lat_dt).float()          # stored, read back
        prev, mu, terms = fn(x, v, sig, i, eta, prev=prev)
        nxt[:, k], mean[:, k] = prev, mu
        if terms.ndim == 1:                      # a project's function reduces itself (the mean)
            lp[:, k] = terms
            continue
        lp[:, k] = reduce(terms, how)
        lp64[:, k] = reduce_f64(terms, how)
    return nxt, mean, lp, lp64


def rel(a, b):
    a, b = a.double(), b.double()
    d = (a - b).abs()
    return float(d.max()), float((d / b.abs().clamp_min(1e-30)).max())


def cmd_fixture(args):
    meta, t = load(args.traj)
    if "velocity" not in t or meta.get("sampler") != "sde":
        sys.exit(f"{args.traj}: needs an SDE trajectory with velocity (diffusion-capture --capture-velocity)")
    nxt, mean, lp, lp64 = run(meta, t)
    steps = t["sde_steps"]
    stored = torch.stack([t["latents"][:, int(i) + 1].float() for i in steps], dim=1)
    out = {"next": nxt.numpy(), "mean": mean.numpy(), "logp": lp.numpy(), "logp_f64": lp64.float().numpy()}
    info = {"format": "hi3.sde-reference", "trajectory": os.path.basename(args.traj),
            "sde_kernel": meta.get("sde_kernel", "flow-grpo"), "eta": meta["eta"],
            "logprob_reduce": meta.get("logprob_reduce", "mean"), "latent_dtype": meta["latent_dtype"],
            "torch": torch.__version__}
    save_file(out, args.out, metadata=info)
    dn, rn = rel(stored, nxt)
    dl, rl = rel(t["sde_logp"], lp)
    print(json.dumps({"trajectory": args.traj, "kernel": info["sde_kernel"], "latent_dtype": meta["latent_dtype"],
                      "next_max_abs": dn, "next_max_rel": rn, "logp_max_abs": dl, "logp_max_rel": rl,
                      "logp_vs_f64_max_rel": rel(t["sde_logp"], lp64.float())[1]}))


# ------------------------------------------------------------ upstream check

MIRRORS = os.environ.get("UPSTREAM_MIRRORS", "")


def source(repo, commit, path):
    return subprocess.run(["git", "-C", f"{MIRRORS}/{repo}/repo", "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def function(src, name, cls=None):
    """The source of def name (in class cls) of a module's text."""
    tree = ast.parse(src)
    body = tree.body
    if cls:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    lines = src.splitlines()[node.lineno - 1:node.end_lineno]
    indent = len(lines[0]) - len(lines[0].lstrip())
    return "\n".join(line[indent:] for line in lines)


def flow_grpo_fn(ns, sde_type):
    """Flow-GRPO's sde_step_with_logprob (exec'd into ns) as a kernel."""
    class Sched:
        def __init__(self, sigmas):
            self.sigmas = sigmas

        def index_for_timestep(self, t):
            return int(t)

    def fn(x, v, sigmas, i, eta, noise=None, prev=None):
        ts = torch.full((x.shape[0],), i)
        kw = {} if sde_type is None else {"sde_type": sde_type}
        got, lp, mu, std = ns["sde_step_with_logprob"](Sched(sigmas), v, ts, x, noise_level=eta,
                                                       prev_sample=x if prev is None else prev, **kw)
        if prev is None:
            if sde_type == "sde":
                std = std * torch.sqrt(-1 * (sigmas[i + 1] - sigmas[i]))
            return mu + std * noise, mu, None
        return got, mu, lp
    return fn


def cmd_upstream(args):
    import typing
    meta, t = load(args.traj)
    kernel = meta.get("sde_kernel", "flow-grpo")
    if meta.get("logprob_reduce", "mean") != "mean":
        print(json.dumps({"kernel": kernel, "latent_dtype": meta["latent_dtype"],
                          "not_checked": "the projects' functions reduce by the mean"}))
        return

    def namespace():
        return {"math": math, "torch": torch, "Optional": typing.Optional, "Union": typing.Union,
                "Tuple": typing.Tuple, "List": typing.List, "GeneratorLike": typing.Any,
                "FlowMatchEulerDiscreteScheduler": object, "randn_tensor": None}
    view = lambda x: (-1,) + (1,) * (x.ndim - 1)  # noqa: E731
    checks = []
    if kernel in ("flow-grpo", "cps") and os.environ.get("FLOW_GRPO_SDE"):
        # yifan123/flow_grpo 54809b5's file (mirrors may hold a snapshot
        # from before sde_type): FLOW_GRPO_SDE names a copy of it
        ns = namespace()
        with open(os.environ["FLOW_GRPO_SDE"]) as f:
            exec(function(f.read(), "sde_step_with_logprob"), ns)
        checks.append(("flow_grpo 54809b5", flow_grpo_fn(ns, "sde" if kernel == "flow-grpo" else "cps")))
    if kernel == "flow-grpo":
        ns = namespace()
        src = source("Tencent-Hunyuan+UniRL", "1a7b501", "unirl/sde/kernels.py")
        exec(function(src, "step", "FlowSDEStrategy"), ns)
        exec(function(src, "compute_log_prob", "FlowSDEStrategy"), ns)

        def fn(x, v, sigmas, i, eta, noise=None, prev=None):
            s = sigmas[[i] * x.shape[0]].view(view(x))
            s_next = sigmas[[i + 1] * x.shape[0]].view(view(x))
            # given prev_sample the strategy draws nothing: its sample is
            # prev_sample_mean + std_dev_t * sqrt(-dt) * noise = mean + std * noise
            _, mu, std = ns["step"](None, v, x, s, s_next, eta, prev_sample=x if prev is None else prev,
                                    sigma_max=sigmas[1].item())
            if prev is None:
                return mu + std * noise, mu, None
            return prev, mu, ns["compute_log_prob"](None, prev, mu, std)
        checks.append(("UniRL 1a7b501", fn))
    elif kernel == "cps":
        ns = namespace()
        src = source("IamCreateAI+FlowCPS", "b402c7a", "flow_grpo/diffusers_patch/sd3_sde_with_logprob.py")
        exec(function(src, "sde_step_with_logprob"), ns)
        checks.append(("FlowCPS b402c7a", flow_grpo_fn(ns, None)))
    else:
        ns = namespace()
        src = source("XueZeyue+DanceGRPO", "15cc71d", "fastvideo/train_grpo_flux.py")
        exec(function(src, "flux_step"), ns)

        def fn(x, v, sigmas, i, eta, noise=None, prev=None):
            mu, _ = ns["flux_step"](v, x, eta, sigmas, i, None, False, True)
            if prev is None:
                return mu + noise * (eta * math.sqrt(sigmas[i] - sigmas[i + 1])), mu, None
            got, _, lp = ns["flux_step"](v, x, eta, sigmas, i, prev, True, True)
            return got, mu, lp
        checks.append(("DanceGRPO 15cc71d", fn))
    ours = run(meta, t)
    ok = True
    for name, fn in checks:
        theirs = run(meta, t, kernel_fn=fn)
        res = {"kernel": kernel, "against": name, "latent_dtype": meta["latent_dtype"],
               "next_equal": bool(torch.equal(ours[0], theirs[0])),
               "mean_equal": bool(torch.equal(ours[1], theirs[1])),
               "logp_equal": bool(torch.equal(ours[2], theirs[2]))}
        print(json.dumps(res))
        ok = ok and all(res[k] for k in ("next_equal", "mean_equal", "logp_equal"))
    if not ok:
        sys.exit(1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fixture")
    f.add_argument("traj")
    f.add_argument("out")
    u = sub.add_parser("upstream")
    u.add_argument("traj")
    args = p.parse_args()
    {"fixture": cmd_fixture, "upstream": cmd_upstream}[args.cmd](args)


if __name__ == "__main__":
    main()
