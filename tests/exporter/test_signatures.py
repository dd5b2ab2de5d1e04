"""The built-in error signatures against the exact texts MLX, mlx-lm and the write-ups print."""

from __future__ import annotations

import pytest

from mlx_medic.inventory.load import parse_inventory
from mlx_medic.signatures import (
    BUILTIN,
    BUILTIN_BY_NAME,
    LogSignature,
    merged_anchors,
    required_literals,
    signatures_for,
    signatures_matching,
)

# (line, the signatures it must match). Sources: shared/reference/upstream-failure-modes.md
# (MLX source strings), macos-facts.md §6, seed 000 (the incident write-up), and mlx's
# launch.py as installed (log_warning wraps the text in ANSI colour codes).
VERBATIM = [
    # seed 000, the error every restart failed with
    ("RuntimeError: [jaccl] Couldn't allocate protection domain", ["jaccl_protection_domain"]),
    # seed 002 quotes the same failure without the `[jaccl] ` prefix
    ("RuntimeError: Couldn't allocate protection domain", ["jaccl_protection_domain"]),
    ("[jaccl] Changing queue pair to RTR failed with errno 16", ["jaccl_qp_rtr_errno_16"]),
    (
        "RuntimeError: [jaccl] Changing queue pair to RTR failed with errno 22",
        ["jaccl_qp_rtr_errno_22"],
    ),
    ("[jaccl] Changing queue pair to RTR failed with errno 96", ["jaccl_qp_rtr_errno_96"]),
    # the format is "[jaccl] Creating the queue pair failed with '<strerror> (16)'."
    (
        "[jaccl] Creating the queue pair failed with 'Device or resource busy (16)'.",
        ["jaccl_qp_create"],
    ),
    ("[jaccl] Couldn't connect (error: 60)", ["jaccl_connect_error_60"]),
    ("RuntimeError: [jaccl] Couldn't connect (error: 65)", ["jaccl_connect_error_65"]),
    # lyogavin/airllm#367 and exo#948 (no trailing dot), jundot/omlx#2029 (with it)
    (
        "libc++abi: terminating due to uncaught exception of type std::runtime_error: [METAL] "
        "Command buffer execution failed: Caused GPU Timeout Error "
        "(00000002:kIOGPUCommandBufferCallbackErrorTimeout)",
        ["metal_gpu_timeout"],
    ),
    (
        "libc++abi: terminating due to uncaught exception of type std::runtime_error: [METAL] "
        "Command buffer execution failed: Caused GPU Timeout Error "
        "(00000002:kIOGPUCommandBufferCallbackErrorTimeout).",
        ["metal_gpu_timeout"],
    ),
    # seed 000 prints the same error wrapped over three lines; the code is on the last
    ("(00000002:kIOGPUCommandBufferCallbackErrorTimeout).", ["metal_gpu_timeout"]),
    # mlx PR #479; and the unified-log form (ddalcu/mlx-serve#321)
    (
        "[METAL] Command buffer execution failed: Insufficient Memory "
        "(00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)",
        ["metal_out_of_memory"],
    ),
    (
        "Execution of the command buffer was aborted due to an error during execution. "
        "Insufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)",
        ["metal_out_of_memory"],
    ),
    ("[metal::malloc] Resource limit (499000) exceeded.", ["metal_malloc_resource_limit"]),
    # seed 000: the first line of the wrapped traceback, and the whole command on one line
    (
        "subprocess.CalledProcessError: Command 'ssh ai005 'pid=$(cat /var/folders/.../tmp.None);",
        ["launch_teardown_failed"],
    ),
    (
        "subprocess.CalledProcessError: Command 'ssh ai005 'pid=$(cat /var/folders/.../tmp.None); "
        "if ps -p $pid >/dev/null; then kill $pid; echo 1; else echo 0; fi; "
        "rm /var/folders/.../tmp.None'' returned non-zero exit status 1.",
        ["launch_teardown_failed"],
    ),
    (
        "  rm /var/folders/.../tmp.None'' returned non-zero exit status 1.",
        ["launch_teardown_failed"],
    ),
    # seed 004: mlx.launch refuses a JACCL hostfile (argparse's `prog: error:` line); the other
    # two texts are launch.py's own (as installed), which the seed's run did not reach
    (
        "mlx.launch: error: The hostfile is malformed: no RDMA device is listed for m3-ultra-1 to "
        "m3-ultra-2, ...",
        ["launch_hostfile_malformed"],
    ),
    (
        "mlx.launch: error: The hostfile is malformed: number of RDMA devices does not match hosts",
        ["launch_hostfile_malformed"],
    ),
    (
        "mlx.launch: error: The hostfile is malformed: RDMA device of self should be null",
        ["launch_hostfile_malformed"],
    ),
    ("\x1b[33m[WARN] Node with rank 1 exited with code 1 \x1b[0m", ["launch_rank_failed"]),
    ("\x1b[33m[WARN] Node with rank 0 was killed \x1b[0m", ["launch_rank_failed"]),
    ("\x1b[33m[WARN] Node with rank 3 exited with code -9 \x1b[0m", ["launch_rank_failed"]),
    ("[ring] connection to a peer was lost", ["ring_peer_lost"]),
    ("[ring] Too many send/recv errors. Aborting...", ["ring_peer_lost"]),
    # Python's threading excepthook: "Exception in thread <name>:" with name "Thread-N (target)"
    ("Exception in thread Thread-2 (_generate):", ["generate_thread_died"]),
]

NEAR_MISSES = [
    "[jaccl] Recv failed with errno=2",  # secondary: another rank failed first
    "[jaccl] Recv failed with error code 2",
    "[jaccl] Connection attempt 2 waiting 500 ms",
    "[jaccl] Changing queue pair to RTR failed with errno 160",
    "[jaccl] Changing queue pair to RTR failed with errno 2",
    "[jaccl] Couldn't connect (error: 61)",
    "[jaccl] Couldn't connect (error: 600)",
    "[JACCL] couldn't allocate protection domain",
    "RuntimeError: couldn't allocate protection domain",
    "[jaccl] Couldn't allocate memory region",
    "RuntimeError: Couldn't allocate the protection domain",
    "The hostfile is malformed",  # no reason after it: not mlx.launch's message
    "the hostfile is malformed: no RDMA device is listed for a to b",
    "ValueError: Hostfile /etc/mlx/h.json doesn't exist",
    "warning: The hostfile is malformed? check it: no",
    "RuntimeError: Cannot initialize jaccl distributed backend.",
    "[METAL] Command buffer execution failed: Impacting Interactivity "
    "(0000000e:kIOGPUCommandBufferCallbackErrorImpactingInteractivity)",
    "(00000004:kIOGPUCommandBufferCallbackErrorSubmissionsIgnored)",
    "(00000005:kIOGPUCommandBufferCallbackErrorInnocentVictim)",
    "(100000002:kIOGPUCommandBufferCallbackErrorTimeout)",
    "[metal::set_wired_limit] Setting a wired limit larger than the maximum working set size "
    "is not allowed.",
    "[metal::malloc] Resource limit exceeded",
    "subprocess.CalledProcessError: Command 'ls /nonexistent' returned non-zero exit status 2.",
    "cleaning /tmp/tmp.Nonexistent",
    "\x1b[34m[INFO] Node with rank 0 completed \x1b[0m",
    "[ring] Too many send/recv errors. Failing pending tasks...",
    "Exception in thread Thread-1 (worker):",
    'INFO:     127.0.0.1:52344 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
]


@pytest.mark.parametrize(("line", "expected"), VERBATIM)
def test_each_verbatim_error_text_matches_exactly_its_signatures(line, expected):
    assert signatures_matching(line) == expected


@pytest.mark.parametrize("line", NEAR_MISSES)
def test_near_misses_match_no_signature(line):
    assert signatures_matching(line) == []


def test_the_issue_lists_every_builtin_name_and_names_are_label_safe_snake_case():
    assert [s.name for s in BUILTIN] == [
        "jaccl_protection_domain",
        "jaccl_qp_rtr_errno_16",
        "jaccl_qp_rtr_errno_22",
        "jaccl_qp_rtr_errno_96",
        "jaccl_qp_create",
        "jaccl_connect_error_60",
        "jaccl_connect_error_65",
        "metal_gpu_timeout",
        "metal_out_of_memory",
        "metal_malloc_resource_limit",
        "launch_teardown_failed",
        "launch_hostfile_malformed",
        "launch_rank_failed",
        "ring_peer_lost",
        "generate_thread_died",
    ]
    for signature in BUILTIN:
        assert signature.name == signature.name.lower()
        assert " " not in signature.name


def test_a_line_carrying_two_errors_matches_both():
    line = "[jaccl] Couldn't allocate protection domain; [ring] connection to a peer was lost"
    assert signatures_matching(line) == ["jaccl_protection_domain", "ring_peer_lost"]


def test_every_builtin_has_anchors_and_every_verbatim_match_contains_one():
    for signature in BUILTIN:
        assert signature.anchors, signature.name
    for line, expected in VERBATIM:
        for name in expected:
            anchors = BUILTIN_BY_NAME[name].anchors
            assert any(a.decode() in line for a in anchors), (name, line)


def test_merged_anchors_still_cover_every_verbatim_error():
    merged = merged_anchors(a for s in BUILTIN for a in s.anchors)
    assert len(merged) < sum(len(s.anchors) for s in BUILTIN)
    for line, _expected in VERBATIM:
        assert any(a.decode() in line for a in merged), line


def test_required_literals_finds_the_longest_literal_run_or_one_per_branch():
    assert required_literals(r"Node with rank \d+ was killed") == ["Node with rank "]
    assert required_literals(r"alpha\d|beta+gamma") == ["alpha", "gamma"]
    assert required_literals(r"(?:abcd|efgh)") == ["abcd", "efgh"]


def test_required_literals_gives_up_when_no_literal_is_certain():
    assert required_literals(r"(?i)protection domain") is None  # case-insensitive
    assert required_literals(r"abcdef|\d+") is None  # one branch has no literal
    assert required_literals(r"[a-z]+\d+") is None
    assert required_literals(r"ab?c") is None  # "ab" and "c": too short to be worth it


def test_inventory_signatures_extend_the_builtin_set_and_may_override_a_pattern():
    inventory = parse_inventory(
        "nodes: {ai001: {ssh: 127.0.0.1}}\n"
        "signatures:\n"
        "  - {name: thunderbolt_bridge_down, pattern: 'bridge0: link state changed to DOWN'}\n"
        "  - {name: ring_peer_lost, pattern: '\\[ring\\] peer gone'}\n"
    )
    signatures = {s.name: s for s in signatures_for(inventory)}
    assert len(signatures) == len(BUILTIN) + 1
    assert signatures["thunderbolt_bridge_down"].matches("bridge0: link state changed to DOWN")
    assert signatures["ring_peer_lost"].matches("[ring] peer gone")
    assert not signatures["ring_peer_lost"].matches("[ring] connection to a peer was lost")
    assert signatures_for(None) == BUILTIN


def test_a_bad_signature_is_refused_with_its_name():
    with pytest.raises(ValueError, match="bad_one"):
        LogSignature("bad_one", "([unclosed")
    with pytest.raises(ValueError, match="label-safe"):
        LogSignature("has space", "x")
