"""One scheduler process per TP rank: GPU memory by the mem-fraction-static arithmetic, then the
host (hierarchical cache) pool by the version's host check, as SGLang does (§2–§4)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from simnode import gpus, state

from sglang._standin import distinit, memory, store
from sglang._standin.launch import Launch
from sglang._standin.log import Log

GiB = memory.GiB
CONTEXT_BYTES = 600 * 2**20  # CUDA context at distributed init
NCCL_BYTES = 400 * 2**20  # NCCL's buffers when there is more than one rank
CUSTOM_ALL_REDUCE_BYTES = 2 * GiB  # SGLang's custom all-reduce over NVLink (H100/H200/B200 …)
NVLINK_GPUS = ("H100", "H200", "H20", "H800", "A100", "A800", "B200", "B300", "GB200")
NCCL_TIMEOUT_S = 600.0


class SchedulerException(Exception):
    """A Python exception inside the scheduler, with the traceback text SGLang would log."""

    def __init__(self, kind: str, message: str, where: str) -> None:
        super().__init__(message)
        self.kind, self.message, self.where = kind, message, where

    def traceback(self) -> str:
        return (
            "Traceback (most recent call last):\n"
            '  File "/usr/local/lib/python3.11/dist-packages/sglang/srt/managers/scheduler.py", '
            "line 2910, in run_scheduler_process\n"
            "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, "
            "pp_rank, dp_rank)\n"
            f'  File "/usr/local/lib/python3.11/dist-packages/sglang/srt/{self.where}", '
            "line 412, in __init__\n"
            f"{self.kind}: {self.message}\n"
        )


def title_for(launch: Launch, rank: int) -> str:
    """The title of local rank ``rank``: named by its global TP rank (node R of a multi-node
    launch runs TP ranks R × per … R × per + per − 1)."""
    return "sglang::scheduler" + (f"_TP{launch.first_rank + rank}" if launch.tp > 1 else "")


def run(launch: Launch, rank: int, pipe_fd: int) -> None:
    """The body of a forked rank process; never returns."""
    stuck = state.has_fault("stuck-on-kill")
    # Under stuck-on-kill a dying server's ranks get SIGUSR1 first, and freeze if they pinned.
    state.die_with_parent(signal.SIGUSR1 if stuck else signal.SIGKILL)
    signal.signal(signal.SIGUSR1, lambda *_: _stick_or_die())
    title = title_for(launch, rank)
    state.set_title(title)
    log = Log(f"TP{launch.first_rank + rank}" if launch.tp > 1 else "")
    signal.signal(signal.SIGTERM, lambda *_: _exit_cleanly())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        try:
            ready = _start(launch, rank, log, title)
        except store.StoreError as exc:  # the store's host went away under a later exchange
            raise _from_store(exc, log) from None
    except SchedulerException as exc:
        log("Scheduler hit an exception: " + exc.traceback())
        state.release_mine()
        os.kill(launch.main_pid, signal.SIGQUIT)
        os._exit(1)
    os.write(pipe_fd, (json.dumps(ready) + "\n").encode())
    while True:
        time.sleep(3600)


def _rendezvous(launch: Launch, rank: int, log: Log) -> None:
    """Meet the other nodes' ranks in torch's store at ``--dist-init-addr``: global rank 0
    serves it and waits for as many as its world size; every rank connects; then the process
    groups and NCCL are set up through it (distinit; simfleet/multinode-sources.md)."""
    shown = launch.dist_timeout
    timeout = shown / launch.speed
    try:
        host, port = store.split_address(launch.dist_init_addr)
        server = store.Server(port) if launch.first_rank + rank == 0 else None
        launch.client = store.Client(host, port, timeout, shown, lambda line: log.raw(line + "\n"))
        launch.client.ask({"join": launch.first_rank + rank})
        if server is not None:
            server.wait_for_workers(launch.world, timeout, shown)
        distinit.run(launch, rank, log)
    except store.StoreError as exc:
        raise _from_store(exc, log) from None


def _from_store(exc: store.StoreError, log: Log) -> SchedulerException:
    """torch's (or Gloo's, NCCL's) error as the scheduler reports it; a lost store's warning
    is logged first, as TCPStore.cpp does."""
    if isinstance(exc, store.StoreGone):
        log.raw(exc.warning + "\n")
    return SchedulerException(exc.kind, str(exc), exc.where)


def _stick_or_die() -> None:
    if state.my_entry().get("host_bytes", 0) > 0:
        state.freeze_self()
    os.kill(os.getpid(), signal.SIGKILL)


def _exit_cleanly() -> None:
    state.release_mine()
    os._exit(0)


def _free(gpu: int) -> int:
    return gpus.view()[gpu].free_bytes


def _start(launch: Launch, rank: int, log: Log, title: str) -> dict[str, object]:
    gpu, local = launch.gpu_ids[rank], launch.device_ids[rank]
    try:
        handles = [open(f"/dev/nvidia{gpu}", "rb"), open("/dev/nvidiactl", "rb")]  # noqa: SIM115
    except FileNotFoundError:
        raise SchedulerException(
            "RuntimeError", "No CUDA GPUs are available", "model_executor/model_runner.py"
        ) from None
    launch.handles = handles  # kept open, as CUDA keeps the device files
    state.update_mine(name=title, leak=launch.leak, gpu={}, host_bytes=0)

    # 1. Distributed init, then the free memory before weights: the MIN over ranks (GiB).
    log("Init torch distributed begin.")
    if launch.nnodes > 1:
        _rendezvous(launch, rank, log)
    launch.sleep(0.2)
    taken = CONTEXT_BYTES
    if launch.tp * launch.pp > 1:
        taken += NCCL_BYTES
        words = gpus.view()[gpu].name.upper().split()
        if not launch.flag("disable_custom_all_reduce", default=False) and any(
            w in NVLINK_GPUS for w in words
        ):
            taken += CUSTOM_ALL_REDUCE_BYTES
    state.add_gpu_bytes(gpu, taken)
    log(f"Init torch distributed ends. mem usage={taken / GiB:.2f} GB")
    local_free = _free(gpu)
    pre = min(launch.exchange("pre", rank, local_free))
    if pre < 0.9 * local_free:
        kind = "ValueError" if launch.version <= (0, 5, 2) else "RuntimeError"
        raise SchedulerException(
            kind,
            "The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
            f"min_per_gpu_memory={pre / GiB:.3f}, local_gpu_memory={local_free / GiB:.3f}, "
            f"local_gpu_memory * 0.9={0.9 * local_free / GiB:.3f}",
            "model_executor/model_runner.py",
        )

    # 2. Weights: this rank's share of the checkpoint.
    log(f"Load weight begin. avail mem={pre / GiB:.2f} GB")
    weights = memory.weights_per_rank(launch.model, launch.tp, launch.pp)
    _load_weights(launch, rank, log)
    if weights > _free(gpu):
        raise _cuda_oom(local, weights, gpu, "model_executor/model_runner.py")
    state.add_gpu_bytes(gpu, weights)
    avail = min(launch.exchange("loaded", rank, _free(gpu)))
    elapsed = "elapsed=1.52 s, " if launch.version >= (0, 5, 23) else ""
    log(
        f"Load weight end. {elapsed}type={launch.model.architecture}, dtype={launch.model.dtype}, "
        f"avail mem={avail / GiB:.2f} GB, mem usage={weights / GiB:.2f} GB."
    )

    # 3. Device KV pool: weights + KV may use mem-fraction-static × the memory free before load.
    total = gpus.view()[gpu].total_bytes
    mfs = float(
        launch.flag("mem_fraction_static")
        or memory.default_mem_fraction(total, launch.tp, launch.pp)
    )
    dtype = str(launch.flag("kv_cache_dtype", default="auto"))
    cell = memory.cell_bytes(
        launch.model, launch.tp, launch.pp, memory.elem_bytes(dtype, launch.model)
    )
    rest = avail - pre * (1 - mfs)
    pool_state = 0
    if launch.model.linear_layers and rest > 0:
        # Hybrid: the Mamba/GDN state pool takes its share first (handle_max_mamba_cache).
        conv, ssm = memory.state_bytes_per_request(launch.model, launch.tp, launch.pp)
        ratio = float(launch.flag("mamba_full_memory_ratio", default=0.9) or 0.9)
        slots = launch.flag("max_mamba_cache_size")
        slots = int(slots) if slots else int(rest * ratio / (1 + ratio) // (conv + ssm))
        pool_state = slots * (conv + ssm)
        rest -= pool_state
        log(
            f"Mamba Cache is allocated. max_mamba_cache_size: {slots}, conv_state size: "
            f"{slots * conv / GiB:.2f}GB, ssm_state size: {slots * ssm / GiB:.2f}GB"
        )
    tokens = int(rest // cell) if rest > 0 else 0
    cap = launch.flag("max_total_tokens")
    if cap:
        tokens = min(tokens, int(cap))
    page = int(launch.flag("page_size", default=1) or 1)
    tokens = tokens // page * page
    if tokens <= 0:
        message = "Not enough memory. Please try to increase --mem-fraction-static."
        if launch.version >= (0, 5, 23):
            message += f" Current value: mem_fraction_static={mfs}"
        raise SchedulerException("RuntimeError", message, "model_executor/model_runner.py")
    kv = tokens * cell
    state.add_gpu_bytes(gpu, kv + pool_state)
    if launch.model.is_mla:
        log(f"KV Cache is allocated. #tokens: {tokens}, KV size: {kv / GiB:.2f} GB")
    else:
        log(
            f"KV Cache is allocated. #tokens: {tokens}, K size: {kv / 2 / GiB:.2f} GB, "
            f"V size: {kv / 2 / GiB:.2f} GB"
        )
    log(f"Memory pool end. avail mem={_free(gpu) / GiB:.2f} GB")

    # 4. CUDA graphs need a few GB beyond the static pool.
    graph = 0
    if not launch.flag("disable_cuda_graph", default=False):
        log(
            "Capture cuda graph begin. This can take up to several minutes. "
            f"avail mem={_free(gpu) / GiB:.2f} GB"
        )
        launch.sleep(0.6)
        graph = memory.graph_bytes(total)
        if graph > _free(gpu):
            exc = _cuda_oom(local, graph, gpu, "model_executor/cuda_graph_runner.py")
            exc.kind = "Exception"
            exc.message = (
                f"Capture cuda graph failed: {exc.message}\nPossible solutions:\n"
                "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
                "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
                "3. disable torch compile by not using --enable-torch-compile\n"
                "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge "
                "performance loss)\nOpen an issue on GitHub "
                "https://github.com/sgl-project/sglang/issues/new/choose \n"
            )
            raise exc
        state.add_gpu_bytes(gpu, graph)
        log(
            f"Capture cuda graph end. Time elapsed: {0.6 / launch.speed:.2f} s. "
            f"mem usage={graph / GiB:.2f} GB. avail mem={_free(gpu) / GiB:.2f} GB."
        )
    context_len = int(
        launch.flag("context_length") or launch.model.text.get("max_position_embeddings", 32768)
    )
    if rank == 0:
        log(
            f"max_total_num_tokens={tokens}, chunked_prefill_size="
            f"{launch.flag('chunked_prefill_size', default=8192)}, max_prefill_tokens="
            f"{launch.flag('max_prefill_tokens', default=16384)}, max_running_requests="
            f"{launch.flag('max_running_requests') or min(4096, tokens // 2)}, context_len="
            f"{context_len}, available_gpu_mem={_free(gpu) / GiB:.2f} GB"
        )

    # 5. Hierarchical cache: the host pool, checked by each rank, then pinned.
    host = 0
    if launch.flag("enable_hierarchical_cache", default=False):
        host = _host_pool(launch, rank, log, tokens, cell)

    # 6. Every rank must be ready: a dead peer leaves the others waiting in a collective.
    try:
        launch.exchange("ready", rank, 1, patience=NCCL_TIMEOUT_S)
    except TimeoutError:
        log(
            "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, "
            "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 "
            "milliseconds before timing out."
        )
        os.abort()
    return {
        "status": "ready",
        "max_total_num_tokens": tokens,
        # tp_worker.py: max_req_len = min(context_len - 1, max_total_num_tokens - 1), and the
        # input may take all of it but 5.
        "max_req_input_len": min(context_len - 1, tokens - 1) - 5,
        # ServerArgs resolves the default before it is printed or served (server_args.py).
        "mem_fraction_static": round(mfs, 3),
        "weight_gib": round(weights / GiB, 2),
        "kv_gib": round(kv / GiB, 2),
        "graph_gib": round(graph / GiB, 2),
        "host_bytes": host,
        "host_tokens": host // cell if cell else 0,
        "context_len": context_len,
        "max_running_requests": int(launch.flag("max_running_requests") or min(4096, tokens // 2)),
        "max_prefill_tokens": int(launch.flag("max_prefill_tokens", default=16384)),
    }


def _load_weights(launch: Launch, rank: int, log: Log) -> None:
    shards = max(1, len([n for n in os.listdir(launch.model.path) if n.endswith(".safetensors")]))
    steps = min(shards, 8)
    for step in range(steps + 1):
        if rank == 0:
            done = shards * step // steps
            percent = 100 * step // steps
            end = "\n" if step == steps else "\r"
            log.raw(
                f"Loading safetensors checkpoint shards: {percent:3d}% Completed | "
                f"{done}/{shards} [00:{step:02d}<00:{steps - step:02d},  1.20it/s]{end}"
            )
        launch.sleep(1.2 / steps)


def _cuda_oom(local: int, size: int, gpu: int, where: str) -> SchedulerException:
    view = gpus.view()[gpu]
    used = view.used_bytes
    return SchedulerException(
        "torch.OutOfMemoryError",
        f"CUDA out of memory. Tried to allocate {size / GiB:.2f} GiB. GPU {local} has a total "
        f"capacity of {view.total_bytes / GiB:.2f} GiB of which {view.free_bytes / GiB:.2f} GiB "
        f"is free. Including non-PyTorch memory, this process has {used / GiB:.2f} GiB memory in "
        f"use. Of the allocated memory {used / GiB:.2f} GiB is allocated by PyTorch, and 0.00 GiB "
        "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
        "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        where,
    )


def _mem_available() -> int:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _cgroup_headroom() -> int | None:
    try:
        with open("/sys/fs/cgroup/memory.max") as handle:
            limit = handle.read().strip()
        with open("/sys/fs/cgroup/memory.current") as handle:
            current = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else int(limit) - current


def _host_pool(launch: Launch, rank: int, log: Log, device_tokens: int, cell: int) -> int:
    version = launch.version
    size_gb = int(launch.flag("hicache_size", default=0))
    ratio_flag = launch.flag("hicache_ratio")
    available = _mem_available()
    if version >= (0, 5, 21):
        headroom = _cgroup_headroom()
        if headroom is not None:
            available = min(available, headroom)
    per_host = launch.ranks
    if version >= (0, 5, 21) and not size_gb and ratio_flag is None:
        budget = 0.8 * (available - memory.HOST_RESERVE_BYTES) / per_host
        ratio = min(2.0, 0.95 * budget / (device_tokens * cell))
        log(
            f"HiCache auto-sizing: ratio 2.0 -> {ratio:.2f}; {budget / GiB:.2f} GiB host memory "
            f"per rank (fraction 0.8, {per_host} ranks on this host), host pools "
            f"{budget * per_host / GiB:.2f} GiB."
        )
    else:
        ratio = float(ratio_flag) if ratio_flag is not None else 2.0
    page = int(launch.flag("page_size", default=1) or 1)
    tokens = memory.host_pool_tokens(version, device_tokens, cell, size_gb, ratio, page)
    requested = tokens * cell
    if version <= (0, 5, 12) and tokens <= device_tokens:
        raise SchedulerException(
            "AssertionError",
            "The host memory should be larger than the device memory with the current protocol",
            "mem_cache/memory_pool_host.py",
        )
    # Each rank checks on its own, against the whole machine (≤ 0.5.18) or its share (≥ 0.5.19).
    budget = available - memory.HOST_RESERVE_BYTES
    if version >= (0, 5, 19):
        budget //= per_host
    failed = requested > budget
    launch.exchange("hicache-check", rank, 0.0 if failed else 1.0)
    if failed:
        raise SchedulerException(
            "ValueError",
            f"Not enough host memory available. Requesting {requested / 1e9:.2f} GB but only have "
            f"{budget / 1e9:.2f} GB free. Please reduce the size of the hierarchical cache.",
            "mem_cache/memory_pool_host.py",
        )
    if version >= (0, 5, 21):
        log(
            f"Allocating kv hierarchical KV host pool: {tokens} tokens, "
            f"{requested / 1e9:.2f} GB host memory."
        )
    else:
        log(f"Allocating {requested / 1e9:.2f} GB host memory for hierarchical KV cache.")
    # Never faster than 30 ms a step: ranks must stay near lockstep on a loaded machine.
    state.pin_host(requested, chunks=16, pause=max(0.03, 0.8 / 16 / launch.speed))
    return requested


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run through sglang.launch_server")
