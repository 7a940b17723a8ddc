"""`python bench/results_md.py [--check]`: write bench/RESULTS.md from the files in bench/results/.

    python bench/results_md.py            # rewrite bench/RESULTS.md
    python bench/results_md.py --check    # exit 1 if bench/RESULTS.md is not what this writes

Algorithm: load every file under bench/results/, sort it into a kind by its keys (a chaos run of
`python -m chaos.run` has `chaos` or a name starting `chaos-`; a bench run of
`python -m wave_actors.bench` has `backend` and `per_run`; a stage timing has `stage_ms`; a check
has rows with `text_equal`; a kernel A/B has `rows` or `variants`; anything else, or a file that
is not JSON, is "other" and gets a generic row of its top-level scalars), render one table per
kind with its rows newest first (the `date` field, else the stamp in the file name; undated files
after, by name), then the findings attached to the files of that kind. A finding is printed only
while every file it cites is present, so deleting a JSON file also drops what was said about it.
Pure stdlib; the output holds no generation date, so `--check` compares byte for byte.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
OUT = BENCH / "RESULTS.md"
STAMP = re.compile(r"(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})")
ROWS_SHOWN = 12             # a kernel A/B or check's own rows are tabled up to this many

SECTIONS = (                # kind -> heading; bench runs of other backends follow "sim"
    ("graph", "Capacity bench on the graph backend "
              "(`python -m wave_actors.bench --backend graph`)"),
    ("sim", "Simulator runs (`--backend sim` or `python -m sim.run`: GPU time modelled)"),
    ("stages", "Stage timings (`bench/graph_stages.py`)"),
    ("kernels", "Kernel A/Bs and sweeps (what each showed: `docs/FINDINGS.md`)"),
    ("checks", "Parity and checks (`bench/graph_check.py`)"),
    ("fidelity", "Teacher-forced fidelity per stage (`bench/fidelity.py`)"),
    ("chaos", "Chaos runs (`python -m chaos.run`, `make chaos`: fuzzers against the node and "
              "bridges while victim sessions stream; every figure but the first two must be 0)"),
    ("latency", "Input latency on virtual time (`python -m sim.latency`: the real node, a 1.2 s "
                "stall then its backlog at once, and 10 % message loss)"),
    ("other", "Other files"),
)

# Findings kept beside the measurements they rest on: (kind, title, files cited, text).
NOTES = (
    ("graph", "Reference, 120 sessions: where the beat goes",
     ("graph-reference-n120-20261130T111616.json",),
     "The backend takes ~102.4 ms a beat at p50; the host adds ~1.1 ms before the backend call "
     "(frames read, slots packed, the plan) and ~1.6 ms after the GPU's end (outputs collected "
     "and routed into 120 session mailboxes). MODEL.md §5's floor at 120 sessions is 72.8 ms; "
     "above it are latency-bound stages (perception at the beat's head, the talker's many small "
     "kernels, the codec's TF32 compute) and bandwidth kernels at 88-90 % of the copy rate (SSM "
     "state, talker KV). The JSON's `extra.baseline` is the reference model serving one session "
     "at a time, eagerly, with the same weights: ~240 ms a beat, so without the engine no "
     "session is on time (its `sessions_ratio` credits the baseline with one)."),
    ("graph", "Dense, 280 and 300 sessions: why they miss",
     ("graph-dense-n300-20261130T112120.json", "graph-dense-n280-20261130T112558.json"),
     "At 300 sessions the GPU alone takes 147.3 ms a beat (p99 148.6) and the host ~7 ms more, "
     "so a served beat is ~155 ms: inside the 160 ms deadline, with no room left for jitter or "
     "session starts. That run never got on time: start work at capacity ran past its budget "
     "and left a 6.5 s backlog, which a 155 ms beat drains at ~5 ms a beat. At 280 the backlog "
     "drained by beat 64 (then 99 of 186 beats late): the release itself was late by 5-28 ms, "
     "because the previous beat ends ~10 ms before the next release and the 280 session actors' "
     "output work (~20 ms) ran just then. Both runs predate the start budget (a start that "
     "cannot fit before the deadline is refused) and `BeatClockActor.output_turn` (output work "
     "held from 3 ms before a release until the beat's device work is queued). The memory "
     "ceiling at 1500 frames is 301 dense sessions (121 reference): the engine budgets a "
     "2.5 GB + 25 MB a slot workspace."),
    ("sim", "The roofline simulator's capacity",
     ("sim-reference-n124-20261130T134849.json", "sim-dense-n324-20261130T134653.json"),
     "`--find-max` on the MODEL.md §5 roofline (`sim/costmodel.json`) with the context held at "
     "1500 frames: the largest N with zero late beats is 124 reference and 324 dense sessions, "
     "bound by HBM capacity (the §3/§4 memory ceiling), not by time. A model of an H200, not a "
     "measurement; host time is not modelled on virtual time."),
    ("sim", "The H200-fitted simulator under churn",
     ("sim-h200fit-dense-n300.json", "sim-h200fit-dense-churn60-n200.json",
      "sim-h200fit-dense-churn60-n280.json"),
     "`sim/costmodel_h200_dense.json` is fitted to the H200's measured dense beats (0.37 ms a "
     "session plus a fixed part, from the 280 and 300 graph runs) and the engine's memory plan "
     "(301 sessions); its `start_step_s` (30 ms) is an assumption, not a measurement. A burst of "
     "300 opens goes live together after 1.1 s, then no beat is late (p99 149.1 ms). With calls "
     "of 60 s (`--churn 60`, a refused caller redials after 1 s) 200 callers see no late beat, "
     "but 280 callers keep only ~244 sessions live: with the live beat near 120 ms or more, a "
     "30 ms start step no longer fits beside it, and 287 of 863 opens are refused. What a real "
     "start step costs on the GPU decides this."),
    ("stages", "Reference: what bounds the beat",
     ("graph-stages-reference-n8-112-chunked.json",),
     "MODEL.md §5 floors (fixed ms / ms per session, a frame): perception 0.29 / 0.002, RNNT ~0, "
     "thinker 4.13 / 0.072 (SSM + KV), talker 0.78 / 0.185 (fp32 CFG KV), codec 0.09 / 0.02 "
     "(TF32 FLOPs); a frame 5.3 / 0.26, a beat 10.6 / 0.52. Inside the replays at 112 sessions "
     "the talker's fp32 CFG attention is 20.3 of the talker's 25.8 ms a frame at 4.4 TB/s (the "
     "floor); the thinker's SSM is 8.4 of 16.3 ms (3.8 TB/s), its matmuls ~5.2 ms. Left over the "
     "floor: the thinker's matmuls and SSM (~2.5 ms a frame), the talker's TF32 matmuls (~3 ms: "
     "cuBLAS reads the fp32 weights once per 128-row tile of the 224 CFG rows), the codec's TF32 "
     "convolutions and perception's small launches. Five streams gain little: the beat's chain "
     "is hear (both frames) -> think(0) -> think(1) -> speak(1) -> decode(1), and only think(1) "
     "runs beside speak(0), both bandwidth-bound at 120 sessions."),
    ("stages", "Dense: what bounds the beat",
     ("graph-stages-dense-n128-256-lanes.json", "codec-pointwise-ab-h200.json"),
     "At 256 sessions inside the replay: the thinker's SSM is 19.0 of 29.4 ms a frame (3.8 "
     "TB/s), its matmuls 6.4; the talker's attention 13.0 of 19.9 ms (3.9 TB/s); the codec's TF32 "
     "pointwise matmuls 3.9 of 7.5 ms, GELU 1.3; perception 4.6 ms a frame (one step hears both "
     "frames). The fit gives ~143 ms a beat at 300 sessions. Left over the floor at 300: the "
     "SSM's last 10 % to copy bandwidth, the talker attention's last 10 %, the thinker's matmuls "
     "(compute-bound at 256+ rows), and the codec's GELU and residual passes over [B*T, 4C] "
     "(cuBLAS cannot take an exact GELU prologue; the Triton matmul that can was slower: "
     "5.5 against cuBLAS's 3.9 ms a frame at 256, `codec-pointwise-ab-h200.json`)."),
    ("kernels", "Kernels on the H200",
     ("kernels-h200.json", "attn-lanes-h200.json", "small-kernels-ab-h200.json",
      "relpos-ab-h200.json", "attn-layout-h200.json"),
     "At B = 128 and ~1470 positions of context: the fused Mamba2 step 396 us (80 % of 4.3 TB/s; "
     "eager 3541 us), the thinker's GQA decode attention 203 us (89 %; eager 3924 us), the "
     "talker's fp32 CFG attention 408 us (99 %; eager 2856 us); every kernel matches its fp64 "
     "reference and its graph replay equals eager. At 256 rows: talker attention with a per-lane "
     "online softmax 467 us with bf16 KV (3.9 TB/s), 1636 us with fp32 CFG KV (4.4 TB/s); the "
     "Mamba2 conv step 16.2 us; the codec's depthwise conv + LayerNorm 150 / 61 / 33 us at "
     "C = 384 / 768 / 1536. Perception's relpos attention, one launch a layer reading each row's "
     "K/V ring in place: 100 -> 30 us a layer at 120 rows, 153 -> 75 at 300 (4 warps). The "
     "talker's KV holds an even number of positions: Triton proves 16-byte alignment only for a "
     "head stride P*72 divisible by 16, and with an odd P the attention streamed 2.9 instead of "
     "4.4 TB/s."),
    ("graph", "Dense, 220 sessions: late beats from the host, not the GPU",
     ("graph-dense-n220-20261201T214148.json", "graph-dense-n220-20261201T214347.json",
      "graph-dense-n220-20261201T214916.json", "graph-dense-n220-20261201T214545.json",
      "graph-dense-n220-20261201T195041.json"),
     "Four runs at 7946bd9 on one machine: 3 late beats, p99 124.7-152.2 ms, with the "
     "executor's beat at 110.8-111.1 ms (p99 112.4-113.2) in every run. Each bad stretch is a "
     "few beats long and starts the same way in the trace: the frames read in a beat dip (312 "
     "instead of 440), then burst (577-598), and the clock wakes for the release 10-50 ms late "
     "while the session actors work through the burst. A control run of 0f0dff2 right after, on "
     "the same machine, had one such stretch (wake 12.7 ms late, p99 119.7), and the earlier run "
     "of the same tree none (p99 118.1). Between the two trees nothing on the per-frame path "
     "changed (node, session table and actors are identical; the clock only adds a test of an "
     "empty set per beat), so the spread is the host's: at 220 sessions the node's single event "
     "loop has too little slack to absorb a caller-side burst. Moving the release off the event "
     "loop is the fix this points to."),
    ("graph", "After the protocol rework (8cb8d93): late beats and unexplained errors",
     ("graph-reference-n120-20261201T224823.json", "graph-dense-n220-20261201T225142.json"),
     "Reference 120 x 3 x 500: 0, 0 and 2 late beats; the 2 follow one stretch where the event "
     "loop woke 75 ms late (7 ms of garbage collection before it), p99 110.3 / 109.4 / 118.4 ms "
     "against 107.5-108.5 at 7946bd9, the executor unchanged (p50 103.0-103.2 ms). Dense 220 x "
     "2 x 500: 0 and 5 late beats, p99 124.6 / 158.1 ms, 22 underruns in run 2 (0 before) and "
     "452 / 426 errors answered by the node's front per run where every earlier run had 0. "
     "Their codes were not recorded; a sim-backend run of 220 dense sessions on a 2-core CPU "
     "(overloaded, 4 caller processes) answered none, so the next device run must read the "
     "codes the bench now prints before anything is concluded. A candidate cause, fixed after "
     "this run (d35915c) but not measured on the device: a send answered EHOSTUNREACH detached "
     "all of a connection's sessions, and libzmq answers so for a live peer whose full pipe is "
     "draining; about 2 `detached` errors per session while each client resumed would match."),
    ("checks", "What the parity rows mean",
     ("graph-check-h200.json",),
     "fp32, tiny config: the graph backend's text, function and transcript tokens equal the "
     "eager reference model's in all 50 frames (PCM within 1.2e-5). The serving precision "
     "against the same backend run eagerly (same kernels, same batches): every token and PCM "
     "sample equal, tiny and full model. The bf16 profiles against the eager bf16 reference "
     "model: equal for the first 5 frames of the full model, then the free-running sessions "
     "part (27 % of text tokens equal over 50 frames, 97 % of transcript tokens), because "
     "different accumulation orders flip argmax ties on random weights; the eager bf16 and fp32 "
     "references part the same way (`tests/test_model_voicechat_precision.py`)."),
    ("graph", "Starts inside the beat (issue 16) on the H200",
     ("graph-dense-n220-20261202T032532.json", "graph-reference-n120-20261202T032340.json",
      "graph-reference-n108-20261202T031404.json", "graph-reference-n108-20261202T034533.json"),
     "Every captured beat may carry 16 start rows of 16 prompt positions; the talker's warm-up "
     "is copied in at the slot's reset. Measured at build on idle caches, the rows add 30.8 ms "
     "to the 220-session dense beat and 30.2 ms to the 120-session reference beat (a first "
     "version added 145 ms: the Mamba scan read each row's state per position; the dual form "
     "fixed it). Dense 220 at d4c84f7: 220 callers dialled at once opened after 1.5 s at p50, "
     "3.4 s at p99; the GPU at 110.5 / 111.9 ms a beat (p50 / p99) with every session rolling "
     "at 1500 frames; 4 late beats, the first measured ones, behind the start ramp; and 0 node "
     "errors (426–452 a run at 8cb8d93: the liveness fix of 06317dc). Reference 120 at d4c84f7 "
     "failed: the starts fell 5 s behind and the run began with that backlog (431 late of "
     "1500). The bench then filled each new session's modelled context with random rows, "
     "gigabytes of temporaries a start beat on a device planned to its memory ceiling; b06c352 "
     "holds the context by its counters alone, and that was not the cause: at c2ea129 (the "
     "last code commit) 108 reference callers dialled at once still opened after 2.4 s at p50, "
     "5.8 s at p99, and the run began 4 s behind. Its measured beats take 95–106 ms on the GPU "
     "(121 with a burst's rows, ~126 in the beats where a start group rolls) except two "
     "consecutive beats of 1.12 s, seven beats after the burst (the cause, found at f22385f: the "
     "next finding); "
     "every measured beat was late behind the backlog. The burst of 12 onto 108 itself opened "
     "within 129 ms (p99). At 84a125e (rows then judged by a miscounted budget, later fixed) "
     "the same burst opened within 1.04 s, with 2 late beats."),
    ("graph", "Starts inside the beat at f22385f: the 1 s beats were the poll's own sleep",
     ("graph-reference-n120-20261202T055421.json", "graph-dense-n220-20261202T060407.json",
      "graph-reference-n108-20261202T054752.json", "graph-reference-n114-20261202T054927.json",
      "graph-dense-n198-20261202T055516.json", "graph-dense-n198-20261202T060648.json",
      "graph-dense-n209-20261202T055654.json", "graph-dense-n209-20261202T060604.json"),
     "The ramp's slow beats, now recorded by the bench, showed every beat with start rows at "
     "~970 ms whatever it carried, each 1.2 ms shorter than the one before. The executor slept "
     "until the fastest recent beat of its graph would end, and learned that time from the "
     "loop's wall clock: the first rows beat took 974 ms to launch (the talker's warm-up "
     "template built on first use), and every later rows beat slept that long and learned it "
     "again. It now learns from CUDA events on the device (f22385f), and the warm-up template "
     "is built with the executor. Reference 120 x 3 x 500: 0 late, p99 99.3-100.4 ms, opens "
     "1.0-1.2 s at p99 (5493 ms and 6.8 s before). Dense 220 x 3 x 500: 0 late, p99 119.4-132.0 "
     "ms with the executor at 107-110 ms; the tail is the event loop waking 10-28 ms late for "
     "the release, as in the earlier dense findings. Bursts: 12 onto 108 reference opened "
     "within 0.11 s, 0 late; 22 onto 198 dense within 0.24 s with 1 late beat (eager), or "
     "within 1.12 s and 0 late with the budgeted policy (6 beats held). Churn 60 s: 114 "
     "reference callers 0 late, 0 refused, 111-114 live; 209 dense callers 81 late (eager) or 4 "
     "(budgeted), 0 refused, 203-209 live. At 209 dense sessions a beat with any start rows "
     "takes ~140 ms on the executor against ~101 without (16 rows are captured whether 1 or 16 "
     "are used), and under churn nearly every other beat carries one: a smaller captured rows "
     "variant for the common one- or two-row beat is the next step. The bench's JSON records "
     "since 0582cf3 the executor's launch times and allocator counters: no allocator retries in "
     "any run. Files from the warm run after f22385f's first call name d25d8c2 (the device "
     "copy's stale .git) and were corrected to f22385f; the tree sent was f22385f, clean."),
    ("graph", "Output work in slices of the loop (13c6bcb): the host's tail gone",
     ("graph-dense-n220-20261202T081851.json", "graph-dense-n220-20261202T083700-two-runs.log",
      "graph-reference-n120-20261202T082432.json", "graph-reference-n108-20261202T083316.json",
      "graph-reference-n114-20261202T083457.json", "graph-dense-n198-20261202T082733.json",
      "graph-dense-n209-20261202T082628.json", "graph-dense-n209-20261202T083210.json"),
     "asyncio runs every ready task before it fires a timer, and a finished beat woke every "
     "session at once: 220 sessions' output work ran as one block of ~45 ms, and whenever it "
     "reached past the next release the clock woke late, the next beat's outputs came later "
     "still, and the lateness grew beat on beat (10, 19, 27 ms). The clock's OutputTurns now "
     "runs at most 16 sessions' output work a loop turn, none in the release hold, queued "
     "outside the sessions' mailboxes so their audio is still taken (13c6bcb, with the small "
     "start-row capture of 9fb204f). The loop's wake for the release: p99 0.2-0.4 ms in steady "
     "runs (10-28 ms before). Dense 220 x 3 x 500: p99 118.9 / 118.0 / 116.6 ms with one late "
     "beat (160.4 ms) in run 1, where the loop woke 36 ms late once, alone between on-time "
     "beats (gc 3.8 ms; cause not found). A second sample at the same commit (the call's "
     "timeout ended its third run, so only the log exists): 0 late, p99 114.3 / 115.2 ms. "
     "Reference 120 x 3 x 500: 0 late, p99 101.3-102.2 ms (99.3-100.4 at f22385f). Bursts: 12 onto 108 reference "
     "opened within 0.16 s, 22 onto 198 dense within 0.31 s, both 0 late (eager). Churn 60 s: "
     "114 reference callers 0 late, 0 refused, 111-114 live; 209 dense callers 0 late, 0 "
     "refused, 205-209 live with the budgeted policy (500 beats; 10 beats held their rows), "
     "and 0 late, 207-209 live with eager over 300 beats. A capture of 4 start rows adds 14.2 "
     "ms to the beat against 30.2 ms for 16."),
    ("graph", "Every target at 16607c7, with the loop's stalls sampled",
     ("graph-dense-n220-20261202T105318.json", "graph-dense-n220-20261202T103720.json",
      "graph-reference-n120-20261202T104334.json", "graph-reference-n108-20261202T104418.json",
      "graph-reference-n114-20261202T104655.json", "graph-dense-n198-20261202T104515.json",
      "graph-dense-n209-20261202T104837.json", "fidelity-reference-h200.json",
      "fidelity-dense-h200.json"),
     "The clock now arms a stall watch with each release (d9025e6): a thread that finds the "
     "clock still asleep 4 ms past a release samples the loop thread's stack every 1 ms until "
     "it wakes, and the bench's `host.stalls` keeps the longest with their stacks. Dense 220 x "
     "3 x 500 at 16607c7: 0 late, p99 115.0 / 114.6 / 115.9 ms, executor 107.0-107.4 ms at "
     "p50, the loop's wake at most 0.55 ms late; at d9025e6 (same serving code): 0 late, p99 "
     "113.4 / 118.9 / 115.7 ms, wake at most 2.7 ms, no stall in the measured beats. The one "
     "stall that run found was outside them: the bench joined its load-generator processes on "
     "the loop (47.7 ms, `popen_fork.wait`), now done off it (16607c7). Reference 120 x 3 x "
     "500: 0 late, p99 101.4-101.5 ms. Bursts: 12 onto 108 reference opened within 0.17 s, 22 "
     "onto 198 dense within 0.18 s, both 0 late (one 13.5 ms stall in the node's `_on_audio` "
     "while the burst's callers connected). Churn 60 s: 114 reference callers 0 late, 0 "
     "refused, 111-114 live; 209 dense callers with `budgeted` 0 late, 0 refused, 205-209 "
     "live. Fidelity re-run at 16607c7, both profiles."),
    ("graph", "Dense 300 with output slices: the loop's own CPU is the ceiling (issue 17)",
     ("graph-dense-n300-20261202T090344.json", "host-batching-cpu.json"),
     "At 1d839e2 (13c6bcb's serving code plus the loop's CPU in each beat record), 300 dense "
     "sessions x 250 beats: 12 late, p50 / p99 147.2 / 194.4 ms with the executor at 140.5 ms "
     "(p99 142.0); the worst beats were the first measured ones, still draining the start-up "
     "backlog, and 1417 underruns. The loop's thread used 119.7 ms of CPU in a 160 ms beat at "
     "p50 and 154.5 ms at p99 (400 us a live session; the process 142.8 / 204.0 ms): slices keep "
     "the release's wake short (p99 9.2 ms here, 0.2-0.4 ms at 220) only while the loop has "
     "idle time, and at 300 it has almost none. One loop holds about 300 sessions' host work at "
     "best; past that the work has to leave the clock's loop (issue 17's worker processes). "
     "On this CPU, batching a beat's output work across sessions of one format "
     "(host-batching-cpu.json) saves the encoding's share (u-law 24 to 8 us a session, 16-bit "
     "PCM 16 to 11) but not the resampling's: a multi-channel soxr stream costs what N single "
     "ones do (40-48 us a session at 16 and 24 kHz)."),
    ("graph", "Session actors in 4 worker processes: the clock's loop is no lighter (issue 17)",
     ("graph-dense-n300-20261202T111553.json", "graph-dense-n300-20261202T090344.json"),
     "At 2e9ecdf (the host-workers branch), 300 dense sessions x 150 beats with `--workers 4`: "
     "5 late (the first measured beats, after a 74-beat ramp), p50 / p99 149.4 / 175.4 ms, "
     "executor 140.9 ms. The thread of the front's and clock's loop used 119.8 / 134.9 ms of "
     "CPU a beat at p50 / p99 (398 us a live session), against 119.7 / 154.5 ms with every "
     "session on that loop (1d839e2, 250 beats); the process's CPU rose to 160 ms (pickling, "
     "more sockets). So the session actors' own work was a small part of the loop's load: the "
     "cost is the message path through the front (each client message received, parsed, "
     "checked and forwarded; each message a session sends routed back out), and the pyzmq "
     "event handling of its sockets. The stalls sampled sat in the front's sends and the "
     "pool's receive. Next: the front out of the clock's process, so that process only beats."),
    ("graph", "The clock alone in an engine process: dense 300 on time (issue 17)",
     ("graph-dense-n300-20261202T122007.json", "graph-reference-n120-20261202T122507.json",
      "sim-reference-n1000-20261202T122559.json", "graph-reference-n120-20261202T123101.json",
      "graph-dense-n220-20261202T123545.json", "graph-dense-n300-20261202T120529.json"),
     "At 26ea0d0 (the JSON files name 3191842: the same tree, before its commit subject was "
     "shortened) with `--workers 4` the node is three kinds of process: the front (client "
     "socket, admission, the workers' supervisor), 4 session workers, and the engine process "
     "(executor and beat clock, `engine_process.py`), whose loop only reads the workers' frame "
     "batches, beats and sends each worker its rows. Dense 300 x 3 x 500: 0 late, p99 148.1 / "
     "148.8 / 148.4 ms, executor 139.7 ms at p50; the release woke at most 0.69 ms late (p99 "
     "0.02-0.36 ms); host time before plus after the GPU p99 4.2 / 4.9 / 4.4 ms (target 3: "
     "missed, nearly all of it after: the beat's rows gathered and sent to the workers). CPU a "
     "beat: the engine's loop 28-30 ms (97 us a session), its process 38-41 ms, the front 80-89 "
     "ms, the workers 500-542 us a session. The same at d4eabd1 (1 x 150, the rows pickled as "
     "dicts and copied three times): 1 late, after p99 12.4 ms. Reference 120 x 3 x 500 with "
     "4 workers: 0 late, p99 99.9 / 100.2 / 100.8 ms. Sim with a flat 100 ms modelled beat "
     "(`bench/costmodel_flat100.json`), 1,000 sessions, 8 workers, on the H200 host's 16 "
     "cores: 0 late in 200 beats, p99 139.9 ms, but the engine's loop used 65 ms a beat (65 us "
     "a session; target 5 ms: missed), after p99 11.3 ms, and the front 180 ms a beat: one "
     "front process cannot carry 1,000 sessions (opens waited 9.7 s at p99). One process, same "
     "commit: reference 120 x 3 x 500 0 late, p99 105.4 / 102.7 / 102.6 ms; dense 220 x 3 x "
     "500 0 late, p99 114.0 / 114.4 / 115.7 ms."),
    ("graph", "Jitter buffers and routing as arrays; the pack counted as host time (issue 17)",
     ("graph-dense-n300-20261202T144833.json", "graph-reference-n120-20261202T145417.json",
      "graph-reference-n120-20261202T145948.json", "sim-reference-n1000-20261202T145509.json",
      "sim-reference-n300-20261202T144919.json", "engine-beat-cpu-h200host.json"),
     "At 28802d5: the jitter buffers as arrays (`jitter_arrays.ArrayScheduler`, checked in "
     "lockstep against `jitter.BeatScheduler`), a beat's rows routed to the workers as arrays "
     "and handed to ZMQ uncopied, frame batches read together queued as one. The bench's host "
     "time before the GPU now includes the plan and the pack (before: release to the beat "
     "planned only, so the earlier 4.2-4.9 ms left the pack out). Dense 300 x 3 x 500 with "
     "`--workers 4`: 0 late, p99 149.4 / 147.0 / 145.3 ms; release wake p99 0.69 / 0.23 / 0.14 "
     "ms (max 2.1); before + after p99 8.2 / 6.1 / 4.5 ms (target 3: missed), of which after "
     "the GPU 3.5 / 2.2 / 1.5 ms (was 4.1-4.5) and before 5.8 / 4.5 / 3.1 ms, the plan and "
     "pack 2.6 ms at p50; `python -m bench.engine_beat_cpu` on the H200 host's CPU alone "
     "(engine-beat-cpu-h200host.json, at 318148f, the same serving code) gives 2.1 ms at 300 "
     "and 53 us a frame batch, slower than on the 2-core machine here; the engine's loop "
     "34-37 ms of CPU a beat. Reference 120 x 3 x 500, 4 workers: 0 late, p99 "
     "98.7 / 99.0 / 99.3 ms, before + after p99 2.4-2.7 ms; one process: 0 late, p99 102.5 / "
     "102.2 / 104.2 ms. Sim, flat 100 ms beat, H200 host: 300 sessions 4 workers 0 late, p99 "
     "110.1 ms, engine loop 35 ms a beat; 1,000 sessions 8 workers 0 late, p99 125.1 ms (was "
     "139.9), after p99 5.0 ms (was 11.3), engine loop 54 ms a beat (was 65; target 5: "
     "missed), the front 180 ms a beat, opens p99 9.6 s."),
    ("graph", "The clock reads frames on a timer; a beat packed in one gather (issue 17)",
     ("graph-dense-n300-20261202T171444.json", "graph-reference-n120-20261202T172030.json",
      "graph-reference-n120-20261202T172603.json", "sim-reference-n1000-20261202T171537.json",
      "sim-reference-n300-20261202T172116.json", "engine-beat-cpu-h200host-e61419d.json",
      "engine-beat-cpu-e61419d.json"),
     "At e61419d: the clock reads its frame batches every 10 ms from a socket the loop does "
     "not watch (the last read just before each hold; `ClockPolicy.frames_every_s`), a frame's "
     "samples are copied once (message to store), a beat is packed with one gather (silences "
     "from a store place that stays zero), the slot book's plan is array operations (checked "
     "in lockstep against the plain book), the rows are routed ordered by worker, and the sim "
     "writes its outputs as arrays. Dense 300 x 3 x 500 with `--workers 4`: 0 late, p99 143.4 "
     "/ 143.0 / 143.0 ms (was 149.4 / 147.0 / 145.3); release wake p99 0.02 / 0.01 / 0.01 ms; "
     "before + after the GPU p99 3.08 / 3.01 / 2.95 ms (target 3: missed by 0.08 and 0.01 ms "
     "in two runs of three; was 8.2 / 6.1 / 4.5), before p99 1.8-1.9, after 1.3-1.4; the "
     "engine's loop 14.2-14.4 ms of CPU a beat (was 34-37). Reference 120 x 3 x 500, 4 "
     "workers: 0 late, p99 98.6 / 98.6 / 98.6 ms, before + after p99 1.96-2.01 ms; one "
     "process: 0 late, p99 99.9 / 100.1 / 100.4 ms (was 102.5 / 102.2 / 104.2). Sim, flat "
     "100 ms beat, H200 host: 300 sessions 4 workers 0 late, p99 104.7 ms, engine loop 13.6 ms "
     "a beat (was 35); 1,000 sessions 8 workers 0 late, p99 111.2 ms (was 125.1), before + "
     "after p99 7.8 ms, engine loop 21.9 ms a beat, process 30.3 (was 54 / 64; target 5: "
     "missed), the front 167 ms a beat, opens p99 9.7 s. `python -m bench.engine_beat_cpu` on "
     "the H200 host: 5.4 ms of clock work a beat at 300, 9.7 at 1,000 (frames in 3.9, pack "
     "2.5, sim 2.1, route 3.0). The loop's CPU has a floor of about 10 ms a beat whatever the "
     "sessions (12.9 ms at reference 120): each of the 16 timed reads a beat costs a few dozen "
     "small numpy calls, and the release's spin 1 ms."),
    ("graph", "The final commit of issue 17's session: one run each (issue 17)",
     ("graph-dense-n300-20261202T182114.json", "graph-reference-n120-20261202T182404.json",
      "sim-reference-n1000-20261202T182205.json"),
     "At de9b84d (e61419d with the start rows shared by both slot books, a dead sim method "
     "removed and rows indexed once; the lockstep tests unchanged), one run of each, the device "
     "time left holding no more. Dense 300 x 1 x 500, `--workers 4`: 0 late, p99 142.4 ms, "
     "release wake p99 0.01 ms, before + after p99 3.21 ms (target 3: missed), engine loop 13.1 "
     "ms a beat. Reference 120 x 1 x 500, 4 workers: 0 late, p99 97.3 ms, before + after p99 "
     "1.95 ms. Sim 1,000, 8 workers: 0 late, p99 111.7 ms, engine loop 20.3 ms a beat, process "
     "28.2 (target 5: missed). Not run at this commit: the three-run protocol, and reference "
     "120 in one process."),
    ("graph", "Outputs shared with the workers; the three-run protocol at e512013 (issue 17)",
     ("graph-dense-n300-20261202T201944.json", "graph-reference-n120-20261202T202557.json",
      "graph-reference-n120-20261202T203214.json", "sim-reference-n1000-20261202T202648.json",
      "graph-dense-n300-20261202T203413.json", "graph-dense-n300-20261202T200707.json",
      "engine-loop-h200host-e512013.json", "engine-loop-h200host-reads20-e512013.json",
      "engine-beat-cpu-h200host-e512013.json", "engine-beat-cpu-h200host-60b90ec.json",
      "engine-beat-cpu-h200host-copyroute-60b90ec.json", "shared-outputs-h200.json"),
     "At e512013 (run as 8c952d0, whose commit message was reworded afterwards: the same "
     "tree): the beat's output buffers live in shared memory the workers map "
     "(`wave_actors/shared_outputs.py`; page-locked with cudaHostRegister, whose D2H copy "
     "measured 0.087 ms for 300 sessions' PCM against 0.086 into torch's pinned memory, bit "
     "equal), so the clock sends each worker its rows' headers and the worker copies its own "
     "PCM out; a worker's frames wait as long as the clock between reads (10 ms, was 5). "
     "Dense 300 x 3 x 500 with `--workers 4`: 0 late, p99 142.3 / 142.3 / 142.6 ms; release "
     "wake p99 0.02 / 0.02 / 0.01 ms; before + after the GPU p99 2.18 / 2.36 / 2.45 ms (target "
     "3: met; was 3.08 / 3.01 / 2.95), after 0.54-0.58 (was 1.3-1.5); the engine's loop "
     "12.0-12.8 ms of CPU a beat. Reference 120 x 3 x 500, 4 workers: 0 late, p99 98.3 / 97.9 "
     "/ 97.9 ms; one process: 0 late, p99 99.4 / 99.2 / 100.0 ms. Sim 1,000, 8 workers, flat "
     "100 ms beat: 0 late, p99 108.6 ms, before + after p99 5.7 ms (was 7.8), engine loop 19.4 "
     "ms a beat, process 24.6 (target 5: missed), the front 153 ms a beat, opens p99 9.9 s. "
     "`python -m bench.engine_loop` (the engine process alone with stand-in workers on real "
     "ipc sockets) on the H200 host: loop 12.0 ms a beat at 300 sessions, 16.1 at 1,000; with "
     "reads every 20 ms 15.4 at 1,000, and dense 300 x 1 with `--frames-every-ms 20`: 0 late, "
     "p99 143.1 ms, before + after p99 2.44 ms, loop 10.2 ms. `python -m "
     "bench.engine_beat_cpu` (the clock's work without the loop): route 0.67 -> 0.29 ms at "
     "300 and 2.76 -> 0.35 ms at 1,000 with the outputs shared (60b90ec, copy route against "
     "shared); 4.6 ms of work a beat at 1,000 (frames in 2.4, pack 1.7, the sim 1.4). "
     "graph-dense-n300-20261202T200707 is one run at fa6819e (the same serving code but the "
     "bench not closing its engine): 0 late, before + after p99 2.3 ms."),
    ("graph", "Frames through a shared ring; every target at 7f61687 (issue 17)",
     ("graph-dense-n300-20261202T232715.json", "graph-reference-n120-20261202T233203.json",
      "sim-reference-n1000-20261202T233254.json", "engine-loop-h200host-852ee53.json",
      "engine-loop-h200host-copyframes-852ee53.json", "engine-beat-cpu-h200host-852ee53.json"),
     "At 7f61687: the session workers write every frame into a ring in shared memory "
     "(`wave_actors/shared_frames.py`, stamped with generation and number) and send no frame "
     "message; the clock pulls each slot's next frames at the release and packs from the "
     "ring; its few messages (end-of-stream markers) are read on arrival; the release's spin "
     "sleeps in the thread; the sim hears on a thread of its own. Dense 300 x 3 x 500, "
     "`--workers 4`: 0 late, p99 141.1 / 140.9 / 141.2 ms; release wake p99 0.13 / 0.01 / "
     "0.01 ms; before + after p99 2.09 / 2.22 / 2.43 ms (target 3: met); the engine's loop "
     "4.3-4.5 ms of CPU a beat (was 12.0-12.8), the engine process 10.1-10.7. Reference 120 x 3 "
     "x 500, 4 workers: 0 late, p99 97.0 / 97.1 / 97.2 ms, loop 4.1-4.3 ms. Sim 1,000 x 200, 8 "
     "workers, flat 100 ms beat: 0 late, p99 106.2 ms; the engine's loop 5.3 ms a beat at p50 "
     "(p99 6.7), the process 7.0 (target 5: missed; was 19.4 / 24.6); the front 166 ms a beat, "
     "opens p99 9.7 s. At 852ee53 (7f61687 less the ring cleared at each clock start): "
     "`python -m bench.engine_loop` on the H200 host, loop 2.9 ms a beat at 300 sessions, 5.4 "
     "at 1,000 (15.0 with the frames copied through messages, `--copy-frames`); `python -m "
     "bench.engine_beat_cpu` at 1,000: frames in 0.46 ms (was 2.4), pack 2.7 (the gather of "
     "10 MB out of the ring, what is left of the clock's own work), route 0.5. Runs 2 and 3 "
     "of the bench at 852ee53 heard the previous run's frames (generations repeat across the "
     "nodes one engine serves): fixed at 7f61687, those JSONs not kept."),
    ("graph", "The sim reads the ring itself, workers encode in one array; every target at "
              "d236f03 (issue 17)",
     ("graph-dense-n300-20261203T045751.json", "graph-reference-n120-20261203T050341.json",
      "sim-reference-n1000-20261203T045844.json", "sim-reference-n300-20261203T050644.json",
      "engine-loop-h200host-d236f03.json", "engine-beat-cpu-h200host-d236f03.json"),
     "At d236f03 (run as 7b9b35b, renamed when an earlier commit's subject was reworded; the "
     "trees are equal): an executor that reads a beat's frames where they lie "
     "(`Capabilities.reads_frames`, the sim) is handed each row's places in the shared ring "
     "instead of gathered samples; it checks the stamps after its read and the clock counts "
     "what it found rewritten at collect. The graph executor still gets its rows gathered. "
     "Session workers encode each flush's audio of one format and length as one array. "
     "Dense 300 x 3 x 500, `--workers 4`: 0 late, p99 142.8 / 142.5 / 142.5 ms; release wake "
     "p99 0.08 / 0.02 / 0.02 ms (max 0.46); before + after p99 2.82 / 2.74 / 2.64 ms (target "
     "3: met); engine loop 5.1 ms of CPU a beat, the engine process 12.1-12.4. Reference 120 "
     "x 3 x 500, 4 workers: 0 late, p99 98.6 / 98.7 / 98.6 ms (c5dfb7a: 126.8 / 108.6 / 108.7). "
     "Against 7f61687 the graph runs' loop and process CPU are 15-20 % higher and the GPU's "
     "beat ~1 ms longer, though their path changed only by a counter read a beat (the lent "
     "machine may differ from run to run; not examined further). Sim 1,000 x 200, "
     "8 workers, flat 100 ms beat: 0 late, p99 105.5 ms; the engine's loop 3.8 ms of CPU a "
     "beat (p99 4.7; was 5.3 / 6.7); the engine process less the sim's hearing (the GPU's "
     "work in a GPU node) 4.1 ms (p99 5.0): target 5 met at p50; the whole process 7.2 "
     "(p99 8.7) of which the hearing 3.0. Sim 300: loop 2.3 ms, process less hearing 2.6, "
     "whole process 3.6. `python -m bench.engine_loop`: loop 2.6 ms a beat at 300, 3.8 at "
     "1,000 (5.4 at 852ee53); `python -m bench.engine_beat_cpu` at 1,000: pack 0.41 ms "
     "(was 2.7), frames in 0.35, route 0.4."),
    ("sim", "The simulator against the H200, side by side (dense, same code)",
     ("sim-dense-n198-20261202T062823.json", "sim-dense-n209-20261202T062953.json",
      "sim-dense-n220-20261202T063113.json", "graph-dense-n198-20261202T055516.json",
      "graph-dense-n209-20261202T055654.json", "graph-dense-n220-20261202T060407.json"),
     "The H200-fitted simulator at b560332 (f22385f's code) against the H200 at f22385f, the "
     "same bench commands. 220 dialled onto an idle node: sim 0 late, p50 / p99 112.7 / 114.2 "
     "ms, opens 1.1 / 2.2 s; H200 0 late, 113.4 / 119.4-132.0 ms, opens 1.0-1.1 / 2.0-2.3 s. "
     "A burst of 22 onto 198: sim 0 late, p99 124.3 ms, burst opened within 0.32 s; H200 1 "
     "late, p99 142.7 ms, within 0.24 s. Churn 60 s with 209 callers: sim 0 late, p50 / p99 "
     "108.7 / 139.8 ms, opens p99 2.1 s, 206-209 live; H200 81 late, 137.9 / 218.9 ms, opens "
     "p99 1.9 s, 206-209 live. The simulator predicts the starts (opens, live sessions) and "
     "the steady beat; it misses what the host adds: no event-loop wake lateness (10-28 ms on "
     "the H200's worst beats) and none of the host work a start brings, and on the H200 more "
     "than half the churn beats carried start rows (p50 137.9 ms) against fewer than half in "
     "the simulator (p50 108.7 ms)."),
    ("sim", "Starts inside the beat, predicted (the simulator fitted to the H200, dense)",
     ("sim-dense-n198-20261202T032735.json", "sim-dense-n220-20261202T032837.json",
      "sim-dense-n209-20261202T032944.json", "graph-dense-n220-20261202T032532.json"),
     "With the H200's measured 30.8 ms of start rows: a burst of 22 onto 198 live sessions "
     "opens within 320 ms (p99), 0 late; 220 dialled onto an idle node open after 1.1 s at p50, "
     "2.2 s at p99 (the H200 measured 1.5 s and 3.4 s: the simulator leaves out the host's "
     "share of a start); `--churn 60` with 209 callers (95 % of 220): 0 late, 0 refused, 206–209 "
     "live of 209 offered (no sawtooth; it was 215–275 of 280 with eager start steps)."),
    ("sim", "Session starts at capacity (issue 16's baseline, the simulator fitted to the H200)",
     ("sim-dense-n270-20261202T021151.json", "sim-dense-n300-20261202T021329.json"),
     "A burst of 30 callers onto 270 live dense sessions: all 30 refused with 30 slots free: "
     "the live beat takes 135 ms of its 160 and a start step needs 36 ms more (+8 ms "
     "margin). The whole capacity, 300, dialled at once onto an idle node: `opened` after 6.1 s. "
     "Both beats stay on time; both miss issue 16's targets (p99 ≤ 1 s, ≤ 3 s), which need the "
     "start work to ride inside the captured beat instead of an eager step of its own."),
    ("other", "Persistent-kernel primitives and the mailbox on the H200 (issue 18)",
     ("wpk-sync-h200.json",),
     "`python bench/wpk_sync_device.py` at f68eea0 (run as 4c7a4e6, the same tree): one program an SM "
     "(132), cooperative launch. A chain of programs against launch order: correct, 1.1 us a "
     "dependent hop; 500 rounds of grid barriers on one never-reset counter: correct, 1.3 us a "
     "barrier; a doorbell in pinned memory answered by one program: 5.6 us round trip from "
     "Python at p50. The mailbox's controller with 4 stand-in lanes, 500 beats: outputs "
     "correct; ring to acknowledged 7.3 us, to frame 0 done 10.7 us, to beat done 12.3 us at "
     "p50 (21.9 p99) as the host sees them; doorbell to both frames done 5.5 us on the GPU's "
     "clock. At 805f8a3 the host saw the beat done after 64 us: its wait slept with "
     "time.sleep(0), whose timer slack is ~50 us; it spins first since 95d9513. A task-table "
     "program (gpu.wpk.taskrun) over 8 layers of 16 tiles: correct against PyTorch over two "
     "beats, 59 us a beat (7.4 us a layer: its tiles are tiny; this checks the walk, not a "
     "kernel's speed)."),
    ("wpk", "The wpk executor against graph at the same commit (issue 18, stage 1)",
     ("wpk-dense-n290-20261203T075706.json", "graph-dense-n290-20261203T080040.json",
      "wpk-reference-n120-20261203T080246.json", "graph-reference-n120-20261203T080442.json",
      "wpk-dense-n300-20261203T072131.json"),
     "At 31d030d, `--workers 4`, both executors on the same command. The wpk executor: the "
     "clock names each row's ring places and rings a doorbell in pinned memory with plain "
     "stores; a resident one-program controller releases the beat's prefix (queued a beat "
     "early behind a gate: the descriptor's copy, then the frames read on the GPU straight out "
     "of the clients' ring, stamps checked); the worker queues the replay behind it; the "
     "controller publishes the beat done into the mailbox, which the loop polls. Dense 290 x 2 "
     "x 500: wpk 0 late, p99 141.7 / 141.1 ms (p50 138.6 / 138.7); graph 0 late, p99 141.1 / "
     "138.8 (p50 138.2 / 137.7). Release to the executor's call p50 1.06-1.09 ms against "
     "1.66-1.75 (the pack no longer gathers 3 MB), but the executor's time p50 136.9 against "
     "135.5-136.0 ms (+0.9 to +1.4: the frames read over PCIe inside the beat instead of one "
     "copy, the gate, the controller on one SM); done to routed p50 0.45 against 0.46-0.48 "
     "(frame 0 is not routed early: not built). The engine process 16.3 ms of CPU a beat "
     "against 12.4 (not broken down yet; the watchdog thread polls every 1 ms). Reference "
     "120 x 1 x 500: wpk p99 98.5 ms against 98.2, executor p50 95.4 against 95.2, release to "
     "call p50 0.85 against 1.11. Stage 1's target (p99 at least 2 ms below graph's at dense "
     "capacity, host time after the GPU halved) is missed. Capacity: the wpk executor loads "
     "every library kernel with the context (`CUDA_MODULE_LOADING=EAGER`), 1.3 GB more device "
     "memory at 290 (145.2 GB used against 143.8): 300 and 299 dense sessions no longer fit "
     "(refused at build, and out of memory in a capture). Why eager: the first run at 94c29ac "
     "(`wpk-dense-n300-20261203T072131.json`, modules loaded lazily) stalled one beat 4.1 s, "
     "early in its first run, the hang WPK.md §4 describes for a kernel's first launch behind "
     "a resident program (which eager op was not identified; the context rolls begin then); "
     "the controller's frame timeout ended it, the watchdog fell back to graph "
     "beats (96 doorbell beats, then 1,557 graph beats on time, p99 141.9 / 142.5)."),
    ("wpk", "Frame 0 routed while frame 1 computes, and wpk against graph at 10fa1c4 (issue 18, stage 1)",
     ("graph-reference-n120-20261203T100016.json", "wpk-reference-n120-20261203T100239.json",
      "graph-dense-n290-20261203T100511.json", "wpk-dense-n290-20261203T100404.json",
      "graph-dense-n290-20261203T095036.json"),
     "At 10fa1c4, `--workers 4`: the clock routes each beat's frame 0 once the executor has it "
     "(`Capabilities.first_frame`: graph and wpk copy frame 0's rows to pinned memory on a side "
     "stream inside the captured beat, then a count the loop polls) and frame 1 at the beat's "
     "end. Reference 120 x 2 x 500 (graph): 0 late, p50 96.6, p99 100.0 / 99.3 ms; frame 0 "
     "routed 69.8 / 73.2 and 69.8 / 73.3 ms after the release (p50 / p99), ~27 ms ahead of the "
     "beat. Dense 290 x 1 x 200: graph 0 late, p99 138.8, frame 0 at 110.9 / 112.1 (at b20a1bd: "
     "p99 139.4, frame 0 at 111.4 / 112.6); wpk 0 late, p99 139.4, frame 0 at 112.4 / 114.0, "
     "executor p50 136.7 against 135.1. Reference 120 x 1 x 500 (wpk): 0 late, p99 100.8, 40 "
     "underruns (the engine's loop stalled 5.7 ms once). Frame 0 lands at 72 % of the executor's "
     "beat at 120 reference sessions and 81 % at 290 dense: speak(0) and decode(0) share the GPU "
     "with think(1). The cost: the engine's loop spent 7.8 ms of CPU a reference beat against "
     "4.6 at 31d030d (the process 12.5 against 8.3), most of it the poll spinning before frame 0; "
     "the reference p99 is ~1.2 ms above 31d030d's 98.2 (wake p99 0.4-0.6 ms against 0.02, "
     "release to the call p99 2.2-3.5 against 1.5). Polling frame 0 every 0.5 ms instead was "
     "written (ce90886) but reverted unmeasured: no device time was left. "
     "Stage 1's target (p99 2 ms below graph's at dense capacity, host time after the GPU "
     "halved) stays missed: wpk's p99 is 0.5 ms above graph's at 290, and the time from the "
     "executor's end to routed is 0.46-0.47 ms p50 for both."),
    ("other", "Stage 0 on the H200: the RVQ search chained by grid barriers, and PDL (issue 18)",
     ("stage0-h200.json",),
     "`python bench/stage0_device.py` at 10fa1c4, inside CUDA graphs. One frame of the talker's "
     "RVQ (31 codebooks of 1024 x 512 in widths 1, 1, 3, 4, 22): at 120 rows the model's "
     "PyTorch loop (cuBLAS TF32 scores, argmin, gather, two updates: 5 launches a codebook) "
     "0.543 ms; the Triton search a launch a step 0.624 (16 x 64 tiles); one cooperative launch "
     "a width with grid barriers between steps 0.631, the best tiles 0.606 (8 warps) and 0.613 "
     "(16 x 32). At 300 rows: PyTorch 0.650, a launch a step 1.079, chained 0.874 at best (32 x "
     "64; 16 x 64 tiles are too many programs for one cooperative grid). The chain equals the "
     "launch-a-step form bit for bit with the same tiles, and its codes match an fp64 search "
     "everywhere (tf32x3 scores), where the PyTorch loop's TF32 scores miss 5 of 3,720 codes at "
     "120 and 41 of 9,300 at 300. The launch boundaries were not the cost: each step's kernel "
     "is slower than cuBLAS's and the four small ops together, so the talker keeps its PyTorch "
     "loop. PDL: 256 dependent small Triton kernels in a graph take 1.12 us a kernel plain and "
     "0.61 with PDL (4,096 elements; 1.44 and 0.92 at 262,144): ~0.5 us a boundary where both "
     "kernels are Triton; not applied to the beat (most of its Triton kernels follow a cuBLAS "
     "GEMM). The MoG sampling was one launch already (top-p and Gumbel-max, `mog_sample`)."),
    ("wpk", "wpk against graph at the final serving code of the stage-2 session (issue 18)",
     ("wpk-dense-n290-20261203T123013.json", "graph-dense-n290-20261203T123118.json",
      "graph-dense-n290-20261203T123241.json", "wpk-dense-n290-20261203T123404.json",
      "graph-reference-n120-20261203T122715.json", "graph-reference-n120-20261203T122835.json"),
     "At 4adb6cd, `--workers 4`, dense 290 x 1 x 200, two pairs run back to back (wpk, graph, "
     "graph, wpk): p99 140.3 / 142.6 ms for wpk against 143.7 / 140.8 for graph, p50 139.1 / "
     "139.7 against 138.3 / 139.2, 0 late in all four. Which executor's p99 is lower changes "
     "from pair to pair, so stage 1's target (p99 2 ms below graph's, 0 late) is not met. "
     "Reference 120 x 1 x 300 on graph: polling frame 0's count every 0.5 ms "
     "(`--first-poll-ms 0.5`) against the default (every loop turn from just before the "
     "fastest recent frame 0): the clock's loop CPU 6.6 against 7.6 ms a beat at p50, frame 0 "
     "routed 70.3 / 73.3 against 70.1 / 72.5 ms (p50 / p99), beat p99 100.3 against 99.8: "
     "a millisecond of CPU a beat for ~0.2 ms of frame 0's latency. The default stays the spin; "
     "the interval is a flag."),
    ("kernels", "Stage 2 on the H200: perception's feed-forward halves as task ops (issue 18)",
     ("stage2-ffn-h200.json", "stage2-ffn-splitk-h200.json", "stage2-ffn-aligned-h200.json",
      "stage2-ffn-aligned-3sm-h200.json"),
     "`python bench/stage2_device.py`: perception's 48 feed-forward half-steps (d 1024, hidden "
     "4096, bf16 weights, 0.8 GB) as one task-table launch, hand-built (`ffn_chain`) or traced "
     "from the model's own layers, compiled and lowered (`gpu.wpk.lower`), against the same "
     "half-steps in a CUDA graph (cuBLAS, SiLU, the engine's fused add + norm). The graph: "
     "0.78 / 1.07 / 1.43 ms at 2 / 240 / 580 rows (1 / 120 / 290 sessions' two frames). The "
     "task table at 1c7e9cc, best of tiles 64 x 64 x 32, 4 or 8 warps, 1 or 2 programs an SM: "
     "7.8 / 8.1 / 10.9 ms, lowered from the IR 7.8 / 7.9 / 10.9. With split-K (at 4adb6cd; "
     "the second GEMM's K cut until its tiles fill the programs): 2.5 / 4.8 / 10.6 ms, best "
     "tiles 32 x 64 x 64 at 2 rows and 64 x 64 x 32 at 240 and 580; lowered 2.5 / 4.7 / 10.6. "
     "Every half-step, teacher-forced, within 1.4e-3 of PyTorch on the same bf16 inputs; "
     "lowered within 1.1e-3 of the fp32 model end to end. The PTX showed why the tiles were "
     "slow: the record's offsets are runtime values, so x and w moved element by element "
     "(4-byte cp.async, 2-byte loads). With 16-byte vectors where rows are aligned and K "
     "fills its tiles (fcfbfaa, 64 x 64 x 32, 8 warps, 2 programs an SM, 80 registers): "
     "2.18 / 2.89 / 5.97 ms, lowered 2.21 / 2.82 / 5.95; 3 programs an SM: lowered 2.34 / "
     "3.35 / 5.35. Still 2.6-4.2x the graph (0.14-0.37 TB/s against cuBLAS's 0.56-1.06): "
     "the stage-2 path runs on the device from the IR, and perception's target (<= 1.5 ms a "
     "beat at 120) is not in reach with these tiles; x is read as fp32 and converted, each "
     "dependent step waits for every tile of the one before, and at 580 rows the tiles are "
     "small compute tiles."),
    ("kernels", "Stage 2 on the H200: perception's whole step as one task-table launch (issue 18)",
     ("stage2-perception-first-h200.json", "stage2-perception-warps-h200.json",
      "stage2-perception-h200.json", "stage2-perception-rows-h200.json",
      "stage2-perception-one-h200.json"),
     "`python bench/perception_device.py`: perception's streaming step (both frames of a beat, "
     "every session: subsampling, 24 Conformer layers with their attention ring and "
     "convolution cache, the projection) traced in fp32 from the model, compiled and lowered "
     "whole onto the task ops (GEMM and add + norm, and the new EW, softmax, batched GEMM and "
     "convolution ops), GEMM weights in bf16, one cooperative launch a beat; against the same "
     "step in a CUDA graph. Final (dbe13e9, 4 warps, 2 programs an SM, 231 registers): 11.9 / "
     "22.8 / 46.1 ms at 1 / 120 / 290 sessions, against the graph's 3.69 / 6.28 / 9.67 in the "
     "reference profile (bf16, as the engine runs perception) and 4.47 / 15.4 / 31.2 in fp32 "
     "(3d25757, before the bucket layout, measured the same to 0.1 ms). "
     "Outputs within 6.1e-3 of the fp32 model (bf16 weights); with fp32 weights 4.1e-4 at one "
     "session (the model's convolutions run TF32 in cuDNN). Each op's tasks alone at 120 "
     "(no waits, zeroed arena): GEMM 2.8 ms, EW 3.9, batched GEMM 6.5, convolution 1.1, add + "
     "norm 0.2, softmax 0.1: 14.7 of the 22.8; the rest is waiting along ~900 dependent "
     "kernels (at one session 1.5 of 11.9 ms is work). The first run (1304bd4, 8 warps, one "
     "program an SM, 256-element EW steps) took 50.3 ms at 120; 1,024-element EW steps and "
     "batched-GEMM tiles loaded along their unit stride (62aac25) brought it to 22.6. "
     "EW running long rows a row at a time (index arithmetic once a row, 8 x 128 blocks; "
     "480abc8) was slower: EW alone 4.7 against 3.9 ms at 120, the step 24.6 against 22.8; "
     "reverted. Split-K sized by the GEMM op's own tiles, not the compiler's 16-row tiles "
     "(faf0dfa): the records at 120 and 290 sessions are unchanged (the same hash), at one "
     "session the split drops from 64 to 17 parts: 11.1 ms (32,673 tasks) against 11.9 "
     "(68,769), re-measured at 8c14ad0. Stage 2's target (perception <= 1.5 ms of the beat at 120) is missed: 22.8 "
     "ms, 3.6x the graph. The task table stays off the serving path."),
    ("kernels", "Stage 2 on the H200: tile-level dependency counters (issue 18)",
     ("stage2-perception-tiles-h200.json",),
     "`python bench/perception_device.py --counters kernel,4,8,16,8:round-robin` at ffa4b2e "
     "(4 warps, 2 programs an SM): perception's whole step with a counter a block of a "
     "kernel's tiles (`gpu.wpk.tilecounters`: a block waits only for the blocks of earlier "
     "kernels whose arena ranges its own overlap, found from the task ops' footprints) "
     "against a counter a kernel. At 120 sessions: a counter a kernel 22.8 ms (241,985 "
     "tasks); 4 / 8 / 16 blocks a kernel dealt by rows 23.8 / 24.1 / 24.5 ms (371,701 / "
     "527,107 / 786,587 tasks, most of the added ones joins); 8 blocks dealt round-robin "
     "22.5 ms. At one session 11.1 against 11.4 / 11.8 / 12.5 and 11.5. Outputs equal to "
     "the fp32 model as before (6.1e-3 at 120, 5.4e-3 at one). A block still needs two to "
     "nine blocks of its producer (a GEMM's 64-row tiles read what three norm blocks wrote; "
     "a gather reads its whole source), so the waits a tile saves are paid back in joins: "
     "no gain. The waiting is the chain of ~900 dependent kernels, not the width of a "
     "counter. A counter a kernel stays the default."),
    ("wpk", "wpk against graph at the tile-counter commit (issue 18)",
     ("wpk-dense-n290-20261203T160312.json", "graph-dense-n290-20261203T160424.json",
      "wpk-reference-n120-20261203T160552.json", "graph-reference-n120-20261203T160712.json"),
     "At ffa4b2e, `--workers 4`, one call, in this order: dense 290 x 1 x 200, p99 143.3 ms "
     "for wpk against 139.9 for graph (p50 139.1 / 138.3), 0 late each; reference 120 x 1 x "
     "300, p99 98.9 against 99.7, 0 late each. Host time after the GPU's end (`after_ms` "
     "p50): 0.49 against 0.47 ms dense, 0.44 against 0.46 reference. Stage 1's targets "
     "(p99 2 ms below graph's at dense capacity, the host's time after the GPU halved) are "
     "missed again."),
    ("wpk", "wpk against graph after the client work of issue 19 (issue 18's final measurement)",
     ("wpk-dense-n290-20261203T165053.json", "graph-dense-n290-20261203T165200.json",
      "wpk-reference-n120-20261203T165324.json", "graph-reference-n120-20261203T165439.json"),
     "At aa8900d (the node now holds input ahead of real time; the bench's callers send in "
     "real time, so nothing is held), `--workers 4`, one call, in this order: dense 290 x 1 x "
     "200, p99 138.5 ms for wpk against 138.3 for graph (p50 137.7 / 137.3), 0 late each; "
     "reference 120 x 1 x 300, p99 97.9 against 97.8, 0 late each. Host time after the GPU's "
     "end (`after_ms` p50): 0.43 against 0.47 ms dense, 0.35 against 0.37 reference. Stage 1's "
     "targets (p99 2 ms below graph's at dense capacity, the host's time after the GPU "
     "halved) are missed: the executors are within 0.2 ms of each other."),
    ("wpk", "wpk against graph at the session's last commit (issue 18, final)",
     ("wpk-dense-n290-20261203T171315.json", "graph-dense-n290-20261203T171423.json",
      "wpk-reference-n120-20261203T171551.json", "graph-reference-n120-20261203T171713.json"),
     "At 6e638cf, the same commands and order as at aa8900d: dense 290 x 1 x 200, p99 139.6 "
     "ms for wpk against 138.6 for graph (p50 138.4 / 137.4), 0 late each; reference 120 x 1 "
     "x 300, p99 98.7 against 99.5, 0 late each. Host time after the GPU's end (`after_ms` "
     "p50): 0.47 against 0.44 ms dense, 0.42 against 0.40 reference. Stage 1's targets are "
     "missed: wpk's p99 is 1.0 ms above graph's at dense capacity, not 2 ms below, and the "
     "host's time after the GPU is not halved. Between this and aa8900d the two executors "
     "swapped places by about 1 ms: run-to-run spread, not a difference."),
    ("other", "The wpk executor soaked: 10,000 beats with random host delays (issue 18)",
     ("wpk-soak-h200.json",),
     "`python bench/wpk_soak.py --beats 10000` at 31d030d on the H200 (tiny model, 8 slots, "
     "frames from a real shared ring): random host delays up to 3 ms before beats and while "
     "frames are written, 81 session opens and 75 closes (slot resets), 14,465 context rolls, "
     "7 bucket captures between beats (the controller drained and relaunched each time): every "
     "beat rung through the doorbell, none fell back, no hang, no torn frame, no non-finite "
     "output; a beat's wall time 7.1 / 12.9 / 20.1 ms (p50 / p99 / max)."),
    ("graph", "Admission policies on the H200: dense 290 under churn (issue 20)",
     ("graph-dense-n290-20261203T202411-churn60-forecast.json",
      "graph-dense-n290-20261203T202537-churn60-headroom.json",
      "graph-dense-n290-20261203T195602-churn60-forecast.json",
      "graph-dense-n290-20261203T195719-churn60-headroom.json"),
     "`python -m wave_actors.bench --backend graph --profile dense --context 1500 --sessions 290 "
     "--beats 250 --runs 1 --workers 4 --churn 60 --policy forecast|headroom`, each pair in one "
     "device call; T2024/T2025 at 98c44c0 (the final serving code), T1956/T1957 at 1c1e1f8 "
     "(before `forecast` stopped scaling a single measured count). `forecast` (budgeted start "
     "rows; opens admitted while a line through the measured beats stays 8 ms under the "
     "deadline): 24 late of 250, p50 138.6 / p99 178.0 ms, no refusal, opens wait 0.97 / 3.0 s "
     "(p50 / p99); earlier 29 late, p99 177.6. `headroom` (eager rows; opens refused while the "
     "last beat left under 20 ms): 82 late, p50 155.4 / p99 176.6 ms, 1 refused `admission`, "
     "opens 0.45 / 3.1 s; earlier 62 late, 3 refused. Per call: 457 of 505 (forecast) and of "
     "514 (headroom) calls heard a late beat; 342 and 1,178 glitch-seconds a call-hour; the "
     "longest run of late beats 1 and 8. Under 60 s calls about one session starts a beat; at "
     "290 dense sessions a beat with start rows passes 160 ms whatever the policy: eager rows "
     "ride most beats (p50 +17 ms), held rows pile up into full captures (+31 ms). Neither "
     "policy is the default."),
    ("graph", "Traces that say what each beat carried: the cost models' new sources (issue 20)",
     ("graph-dense-n290-20261203T220225.json",
      "graph-dense-n290-20261203T220338-churn60-headroom.json",
      "graph-dense-n290-20261203T220450-churn60-forecast.json",
      "graph-reference-n120-20261203T220626.json",
      "graph-reference-n120-20261203T220741-churn60.json",
      "graph-dense-n290-20261203T223359-churn60-headroom.json",
      "graph-reference-n120-20261203T223525-churn60.json"),
     "At 984fc85, two device calls: `python -m wave_actors.bench --backend graph --profile "
     "dense --context 1500 --sessions 290 --beats 250 --runs 1 --workers 4` steady, then with "
     "`--churn 60 --policy headroom` and `--policy forecast`; `--profile reference --sessions "
     "120 --beats 300` steady and with `--churn 60` (eager). Each beat's trace now records its "
     "start `rows`, slot `resets` and context `rolls`. Dense steady: 0 late, p50 138.2 / p99 "
     "139.4 ms. Dense churn: `headroom` 28 late, p99 164.6 ms, no refusal (the same command "
     "at 98c44c0 gave 82 late, 1 refusal: run-to-run spread of a policy at its threshold); "
     "`forecast` 26 late, p99 176.8 ms (24 at 98c44c0). Reference steady 0 late, p99 99.1 ms; "
     "with churn 0 late, p99 116.8 ms. What the traces show, dense: a beat without start "
     "rows costs 135 ms with or without 4 rolls (+0.5 ms); with one row (the small capture) "
     "152 ms with no roll and 157 ms with 4; a reset adds about 1.5 ms to a beat without rows. "
     "At f6f7cc8 (the final serving code), the same churn commands once more (dense with "
     "`headroom`): dense 91 late, p50 156.2 / p99 180.9 ms, 1 refused `admission`; a beat "
     "with one row and 4 rolls now 162.6 ms at p50 (157.3 at 984fc85): the same command "
     "spreads 10 % in p99 from run to run on the GPU. Reference 0 late, p99 118.5 ms. "
     "`sim.fit` on all six prices the full row capture at +30.9 ms, the small at +16.4, a "
     "reset +0.74, a roll +0.07 and +1.78 more in a beat with rows (reference: small +17.2, "
     "reset +0.36, roll +0.51 and +0.98)."),
    ("graph", "A fifth `headroom` run, at the final serving code (issue 20)",
     ("graph-dense-n290-20261204T034901-churn60-headroom.json",),
     "At 6d43f45: `python -m wave_actors.bench --backend graph --profile dense --context 1500 "
     "--sessions 290 --beats 250 --runs 1 --workers 4 --churn 60 --policy headroom`. 67 late, "
     "p50 153.6 / p99 176.5 ms, 2 refused `admission`. As the cost model now says: the first "
     "beat that rolled a context (beat 46) carried no start rows and took 141.6 ms (135.0 "
     "before and after it), and both refused opens were asked in the 0.3 s that followed, "
     "while that beat was the last without rows. `headroom` has refused in four of its five "
     "runs here."),
    ("other", "Stage by stage at the current code: the cost models' shape (issue 20)",
     ("graph-stages-dense-n64-290-h200.json", "graph-stages-reference-n32-120-h200.json"),
     "At ad348cd on the H200, `python3 bench/graph_stages.py --sessions 64,128,200,290 "
     "--kernels 0 --beat --profile dense` and `--sessions 32,64,96,120 --profile reference` "
     "(without `--beat`: capturing the streamed beat at 120 ran out of memory beside the "
     "stage graphs). Each stage as its own graph, ms a frame at the largest batch: dense 290 "
     "thinker 33.7, talker 23.4, codec 8.7, perception 4.2, RNNT 1.1, mel 0.08 (71.2 a frame; "
     "the whole beat 142.2 ms on one stream, 139.7 on several); reference 120 talker 28.0, "
     "thinker 16.8, perception 2.5, codec 3.7, RNNT 0.9, mel 0.06 (51.9 a frame). `sim.fit "
     "--stages` fits each stage's line over the batch sizes: the beat grows as their sum past "
     "the measured batch (dense 290 → 320 sessions: 135.4 → 147.2 ms; reference 120 → 150: "
     "94.2 → 112.2), and `--stage-speedup` gives what-if models."),
    ("other", "The fitted cost models against the H200 (issue 20)",
     ("sim-validate-h200.json",),
     "`python -m sim.validate <20 GPU runs> --seeds 3 --draws 100` at 6d43f45 (the final "
     "simulator code): each GPU run replayed on the simulated node three times (its seed, then "
     "two more), the sim's mean compared, and 100 times more in the fast mode for the late and "
     "refusal verdicts, which agree when the GPU's answer is one the sim gives in at least 5 % "
     "of its 103 runs. The cost models are fitted on the seven runs whose traces say what each "
     "beat carried (984fc85, f6f7cc8); the 12 earlier current-code runs and a fifth `headroom` "
     "run at 6d43f45 are held out. All 20 PASS: p50 within 2.0 % and p99 within 7.0 % (held "
     "out: 1.5 % and 1.1 %), late and "
     "refusal verdicts agree. The `headroom` churn runs (dense 290) had failed on refusals "
     "(GPU 3, 1, 1 and 0; the sim none in three seeds). Their refusals come from one beat: the "
     "first that rolls a context runs the graph executor's eager roll kernels cold (+7 to +11 "
     "ms where it carries no start rows; every graph trace shows it, no wpk trace: that "
     "executor warms them before serving). Such a beat takes over 140 ms, and `headroom` "
     "refuses the opens that come before the next beat without rows. The cost models now "
     "price it (`first_roll_s`: 8.9 ms dense, 5.0 reference), and the sim refuses in 29 of 103 "
     "runs of that workload, the GPU in 4 of 5 (the fifth, measured after the model, refused "
     "2 opens right after its first rolling beat, 141.6 ms without rows). The three full-node "
     "seeds happen to carry "
     "start rows in that beat; seeds 9, 10, 14 and 18 do not, and refuse on the full node as "
     "the fast mode says. Open waits are shown, not judged: the sim's callers all dial at one "
     "instant, so its waits come in whole beats."),
    ("sim-fast", "Fast mode's speed at 300 sessions (issue 20)",
     ("sim-fast-dense-n300-20261204T034309.json", "sim-fast-dense-n300-20261204T034312.json"),
     "On this 2-core machine at 6d43f45 (the final simulator code): `python -m sim.run --fast "
     "--sessions 300 --churn 60 --beats 3000 --profile dense --cost-model "
     "sim/costmodel_h200_dense.json` ran 493.1 s of virtual time in 0.63 s (779x real time); "
     "the guide's diurnal day (`--workload diurnal:peak=4,duration=1800,call=90 --seed 1`) "
     "2167 s in 2.01 s (1077x). The full node runs about 1x at 300 sessions. "
     "`tests/sim/test_fast.py` checks the fast mode against it on one closed loop: every "
     "measured beat's latency equal, opens within 2 %."),
)


def load(path: Path) -> object:
    """The file's JSON, or None where it is not JSON."""
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        return None


def kind_of(data: object, name: str = "") -> str:
    if not isinstance(data, dict):
        return "other"
    if isinstance(data.get("chaos"), dict) or name.startswith("chaos-"):
        return "chaos"
    if isinstance(data.get("latency"), dict):
        return "latency"
    command = str(data.get("command", ""))
    rows = data.get("rows") if isinstance(data.get("rows"), list) else data.get("variants")
    if "backend" in data and isinstance(data.get("per_run"), list):
        return str(data["backend"])
    if isinstance(data.get("quantities"), dict) and "reference_profile" in data:
        return "fidelity"
    if "stage_ms" in data or "graph_stages" in command:
        return "stages"
    if "graph_check" in command or (isinstance(rows, list) and rows and isinstance(rows[0], dict)
                                    and "text_equal" in rows[0]):
        return "checks"
    if isinstance(rows, list) and all(isinstance(r, dict) for r in rows):
        return "kernels"
    return "other"


def date_of(name: str, data: object) -> str:
    """ISO date of the run: its `date` field, else the stamp in its name, else ''."""
    if isinstance(data, dict) and isinstance(data.get("date"), str):
        return data["date"]
    m = STAMP.search(name)
    return "{}-{}-{}T{}:{}:{}".format(*m.groups()) if m else ""


def cell(text: object) -> str:
    return str(text).replace("\n", " ").replace("|", "\\|")


def code(text: object) -> str:
    """A code span; a table's cell() escapes its pipes later (GFM wants \\| inside spans too)."""
    s = str(text).replace("\n", " ")
    return f"`` {s} ``" if "`" in s else f"`{s}`"


def link(name: str) -> str:
    return f"[{name}](results/{name})"


def short_date(iso: str) -> str:
    return iso[:16].replace("T", " ") if iso else "—"


def num(v: object, fmt: str = "{:.1f}") -> str:
    return fmt.format(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else "—"


def scalar(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True, separators=(",", ":"))
    return str(v)


def table(head: list, rows: list, drop_empty: bool = False) -> list:
    """A Markdown table; with drop_empty, columns that are "—" in every row are left out."""
    if drop_empty and rows:
        keep = [i for i in range(len(head)) if any(str(r[i]) != "—" for r in rows)]
        head, rows = [head[i] for i in keep], [[r[i] for i in keep] for r in rows]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]


def per_run(data: dict, key: str) -> str:
    vals = [num(r.get(key)) for r in data.get("per_run", []) if isinstance(r, dict)]
    return " / ".join(vals) if any(v != "—" for v in vals) else "—"


def first_frame(runs: list) -> str:
    """Release → a beat's first frame routed, p50 / p99 per run, where it came ahead of the
    beat (an executor that routes frame 0 while frame 1 computes)."""
    got = [r["first_frame"] for r in runs
           if r.get("first_frame") and r["first_frame"]["p99"] < r.get("p99_ms", 0)]
    return ", ".join(f"{f['p50']:.1f} / {f['p99']:.1f}" for f in got) or "—"


def live_range(runs: list) -> str:
    """min / median / max live sessions over the measured beats, where the trace has them."""
    live = [n for r in runs for n in (r.get("trace") or {}).get("sessions", [])]
    if not live:
        return "—"
    return f"{min(live)} / {statistics.median(live):g} / {max(live)}"


def bench_row(name: str, date: str, d: dict) -> list:
    runs = [r for r in d.get("per_run", []) if isinstance(r, dict)]
    beats = d.get("beats", "?")
    late = sum(r.get("late_beats", 0) for r in runs)
    total = sum(r.get("beats", 0) for r in runs)
    shape = f"{len(runs)} × {beats}"
    if "runs_requested" in d:
        shape += f" (of {d['runs_requested']})"
    extra = d.get("extra") if isinstance(d.get("extra"), dict) else {}
    ceiling = extra.get("memory_ceiling_sessions", d.get("memory_ceiling_sessions", "—"))
    opens = [r for r in runs if "open_p50_ms" in r]
    waits = " / ".join(f"{r['open_p50_ms'] / 1e3:.1f} / {r['open_p99_ms'] / 1e3:.1f}"
                       for r in opens) if opens else "—"
    refused = sum(r.get("refusals", 0) for r in runs)
    sessions = d.get("sessions", "—")
    bursts = [r["burst"] for r in runs if r.get("burst")]
    if bursts:                     # --burst: callers dialled onto the steady node, apart
        sessions = f"{sessions} + {bursts[0]['sessions']} burst"
        waits += "; burst " + " / ".join(
            f"{b['open_p50_ms'] / 1e3:.1f} / {b['open_p99_ms'] / 1e3:.1f}" if b["opened"]
            else "none opened" for b in bursts)
        refused += sum(b["refused"] for b in bursts)
    return [short_date(date), link(name), d.get("commit", "—"), d.get("profile", "—"),
            sessions, shape, f"{late} of {total}", per_run(d, "p50_ms"),
            per_run(d, "p99_ms"), first_frame(runs), per_run(d, "compute_p50_ms"),
            per_run(d, "compute_p99_ms"), live_range(runs), waits, refused, ceiling,
            code(d["command"]) if "command" in d else "—"]


BENCH_HEAD = ["date (UTC)", "JSON", "commit", "profile", "sessions", "runs × beats", "late",
              "p50 ms (per run)", "p99 ms (per run)", "first frame p50 / p99 ms",
              "backend p50 ms", "backend p99 ms",
              "live min / median / max", "open wait p50 / p99 s", "refused", "memory ceiling",
              "command"]


def stage_fit(pair: object) -> str:
    if isinstance(pair, list) and len(pair) == 2:
        return f"{pair[0]:g} + {pair[1]:g}·N"
    return "—"


def stage_row(name: str, date: str, d: dict) -> list:
    beat = d.get("fit_beat") or {}
    return [link(name), d.get("commit", "—"), d.get("profile", "—"),
            ", ".join(str(s) for s in d.get("sessions", [])), stage_fit(d.get("fit_frame")),
            stage_fit(beat.get("beat one stream")), stage_fit(beat.get("beat streams")),
            code(d["command"]) if "command" in d else "—"]


def stage_detail(name: str, d: dict) -> list:
    """Per stage: the fit's fixed and per-session ms a frame, and the time at the largest N."""
    fits = d.get("fit_fixed_ms_per_session_ms")
    if not isinstance(fits, dict):
        return []
    stage_ms = d.get("stage_ms") or {}
    big = max(stage_ms, key=lambda s: int(s) if s.isdigit() else 0) if stage_ms else None
    body = [[stage, num(f[0], "{:.3g}"), num(f[1], "{:.3g}"),
             num(stage_ms[big].get(stage), "{:.2f}") if big else "—"]
            for stage, f in sorted(fits.items())]
    head = ["stage", "fixed ms", "ms per session", f"ms at {big} sessions"]
    return ["", f"Per stage, one frame ({name}):", ""] + table(head, body)


def rows_table(rows: list) -> list:
    """A file's own rows as a table, when they are few and flat."""
    if not rows or len(rows) > ROWS_SHOWN or not all(isinstance(r, dict) for r in rows):
        return []
    if any(isinstance(v, (dict, list)) for r in rows for v in r.values()):
        return []
    head = list(dict.fromkeys(k for r in rows for k in r))
    return table(head, [[scalar(r.get(k, "")) for k in head] for r in rows])


def own_rows(d: dict) -> list:
    return d["rows"] if isinstance(d.get("rows"), list) else d.get("variants", [])


def listed_row(name: str, date: str, d: dict) -> list:
    return [short_date(date), link(name), d.get("commit", "—"), d.get("gpu", "—"),
            len(own_rows(d)), code(d["command"]) if "command" in d else "—"]


def listed_detail(name: str, d: dict) -> list:
    shown = rows_table(own_rows(d))
    return ["", f"{name}:", ""] + shown if shown else []


def other_row(name: str, date: str, d: object) -> list:
    if isinstance(d, dict):
        what = "; ".join(f"{k}={scalar(v)[:60]}" for k, v in sorted(d.items())
                         if not isinstance(v, (dict, list)))
    else:
        what = "not JSON" if d is None else f"JSON {type(d).__name__}"
    return [short_date(date), link(name), what or "—"]


LISTED_HEAD = ["date (UTC)", "JSON", "commit", "device", "rows", "command"]
STAGES_HEAD = ["JSON", "commit", "profile", "sessions", "frame fit ms",
               "beat fit ms, one stream", "beat fit ms, five streams", "command"]
OTHER_HEAD = ["date (UTC)", "file", "top-level scalars"]
FIDELITY_HEAD = ["JSON", "commit", "profile vs", "config", "sessions × frames", "device",
                 "command"]


def fidelity_row(name: str, date: str, d: dict) -> list:
    return [link(name), d.get("commit", "—"), f"{d['profile']} vs {d['reference_profile']}",
            d["config"], f"{d['sessions']} × {d['frames']}", d.get("device_name", "—"),
            code(d["command"]) if "command" in d else "—"]


def fidelity_detail(name: str, d: dict) -> list:
    """Per quantity: its precision, max and L2 relative error, and top-1 agreement where the
    reference's margin exceeds the precision's bound (counted: the share of rows that did)."""
    rows = [["quantity", "precision", "rel_max", "rel_l2", "counted", "top-1 agree"],
            ["---"] * 6]
    for q, v in d["quantities"].items():
        prec = d.get("stage_precision", {}).get(v.get("stage", q.split(".")[0]), "—")
        top1 = v.get("top1") or {}
        rows.append([q, prec, num(v.get("rel_max"), "{:.2e}"), num(v.get("rel_l2"), "{:.2e}"),
                     num(top1["counted"], "{:.3f}") if "counted" in top1 else "",
                     num(top1["agree"], "{:.4f}") if "agree" in top1 else ""])
    return ["", f"{name}:", ""] + ["| " + " | ".join(map(str, r)) + " |" for r in rows]


CHAOS_HEAD = ["date (UTC)", "JSON", "commit", "mode", "seed", "messages tried",
              "errors answered", "crashes", "sessions lost", "frames unaccounted", "result",
              "command"]
CHAOS_FIGURES = ("messages_tried", "errors_answered", "crashes", "sessions_lost",
                 "frames_unaccounted")


def chaos_row(name: str, date: str, d: dict) -> list:
    c = d["chaos"] if isinstance(d.get("chaos"), dict) else d
    figs = [c[k] for k in CHAOS_FIGURES]
    result = "pass" if not any(figs[2:]) else "FAIL"
    return [short_date(date), link(name), d.get("commit", "—"), c.get("mode", "—"),
            c.get("seed", "—"), *figs, result, code(d["command"]) if "command" in d else "—"]


def chaos_detail(name: str, d: dict) -> list:
    """Per victim: frames sent, heard, dropped, unaccounted, and why it was lost, if it was."""
    victims = [v for v in d.get("victims", []) if isinstance(v, dict)]
    if not victims:
        return []
    rows = []
    for v in victims:
        st = v.get("stats") if isinstance(v.get("stats"), dict) else {}
        rows.append([v.get("name", "?"), "relay" if v.get("relayed") else "direct",
                     v.get("sent", "—"), st.get("frames_in", "—"),
                     st.get("dropped_in", st.get("dropped", "—")), v.get("unaccounted", "—"),
                     v.get("lost") or "—"])
    head = ["victim", "via", "frames sent", "heard", "dropped (in)", "unaccounted", "lost"]
    return ["", f"Victims ({name}):", ""] + table(head, rows)


LATENCY_HEAD = ["date (UTC)", "JSON", "commit", "jitter buffer", "baseline ms",
                "5 s after the stall ms", "stall excess ms (target ≤ 40)",
                "10 % loss excess ms (target ≤ 100)", "command"]


def latency_rows(name: str, date: str, d: dict) -> list:
    return [[short_date(date), link(name), d.get("commit", "—"), buffer, r["baseline_ms"],
             r["after_stall_ms"], r["stall_excess_ms"], r["loss10_excess_ms"],
             code(d["command"]) if "command" in d else "—"]
            for buffer, r in d["latency"].items()]


def latency_row(name: str, date: str, d: dict) -> list:
    return latency_rows(name, date, d)[0]


def latency_detail(name: str, d: dict) -> list:
    """The other buffers of the same file (the table's row shows the first)."""
    rest = latency_rows(name, "", d)[1:]
    return ["", f"Compared in {name}:", ""] + table(LATENCY_HEAD, rest) if rest else []


def shape_of(kind: str) -> tuple:
    """(header, row builder, detail builder) for a kind; bench runs of any backend share one."""
    if kind == "latency":
        return LATENCY_HEAD, latency_row, latency_detail
    if kind == "chaos":
        return CHAOS_HEAD, chaos_row, chaos_detail
    if kind == "stages":
        return STAGES_HEAD, stage_row, stage_detail
    if kind in ("kernels", "checks"):
        return LISTED_HEAD, listed_row, listed_detail
    if kind == "fidelity":
        return FIDELITY_HEAD, fidelity_row, fidelity_detail
    if kind == "other":
        return OTHER_HEAD, other_row, lambda name, d: []
    return BENCH_HEAD, bench_row, lambda name, d: []


def entry(path: Path) -> tuple:
    """(kind, name, data, date, row, detail): a schema that surprises its kind's renderer
    falls back to the generic row instead of failing the whole file."""
    data = load(path) if path.suffix == ".json" else None
    name = path.name
    kind = kind_of(data, name)
    date = date_of(name, data)
    _, row, detail = shape_of(kind)
    try:
        return kind, name, data, date, row(name, date, data), detail(name, data)
    except (TypeError, KeyError, ValueError, AttributeError, IndexError):
        return "other", name, data, date, other_row(name, date, data), []


def notes_of(group: list) -> list:
    """Bullets for the `note`-like fields the files carry."""
    out = []
    for _, name, d, *_ in group:
        if isinstance(d, dict):
            for key in sorted(k for k in d if k.endswith("note") and isinstance(d[k], str)):
                out.append(f"- {name} ({key}): {cell(d[key])}")
    return ["", "Notes recorded in the files:", ""] + out if out else []


def findings(kind: str, present: set) -> list:
    out = []
    for note_kind, title, files, text in NOTES:
        if note_kind != kind:
            continue
        if not all(f in present for f in files):
            print(f"results_md: finding {title!r} dropped: a file it cites is gone",
                  file=sys.stderr)
            continue
        out += ["", f"### {title}", "", f"From {', '.join(link(f) for f in files)}.", "", text]
    return out


HEADER = ("Generated by `python bench/results_md.py` from `bench/results/`; do not edit by hand "
          "(`python bench/results_md.py --check` fails when this file is stale). Rows are newest "
          "first; each names its JSON file, the commit it was measured at and the command that "
          "made it, as the file records them. Latency is at the server boundary, from beat "
          "release to outputs routed; a beat is late past 160 ms.")


def render(results: Path) -> str:
    groups: dict = {}
    for path in sorted(p for p in results.iterdir() if p.is_file()):
        e = entry(path)
        groups.setdefault(e[0], []).append(e)
    present = {p.name for p in results.iterdir()}
    titles = dict(SECTIONS)
    backends = sorted(k for k in groups if k not in titles)
    order = [("graph", titles["graph"]), ("sim", titles["sim"])]
    order += [(b, f"Bench runs on the `{b}` backend") for b in backends]
    order += [s for s in SECTIONS if s[0] not in ("graph", "sim")]
    out = ["# Measurements", "", HEADER]
    for kind, heading in order:
        group = sorted(groups.get(kind, []), key=lambda e: e[1])
        group = sorted(group, key=lambda e: e[3], reverse=True)   # newest first, ties by name
        if not group:
            continue
        head = shape_of(kind)[0]
        out += ["", f"## {heading}", ""]
        if kind == "stages":
            out += ["Fits are ms for N sessions (least squares over the measured N).", ""]
        out += table(head, [e[4] for e in group], drop_empty=head is BENCH_HEAD)
        out += [line for e in group for line in e[5]]
        out += notes_of(group) + findings(kind, present)
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/results_md.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if the output file is stale")
    ap.add_argument("--results", default=str(RESULTS), help="folder of result files")
    ap.add_argument("--out", default=str(OUT), help="the Markdown file to write or check")
    args = ap.parse_args(argv)
    text = render(Path(args.results))
    out = Path(args.out)
    if args.check:
        if not out.exists() or out.read_text() != text:
            print(f"{out} is stale: run python bench/results_md.py", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
