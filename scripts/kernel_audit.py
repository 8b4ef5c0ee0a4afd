#!/usr/bin/env python3
"""Static audit of kvserve's compiled CUDA kernels against kernels/cuda/kernel_budgets.txt.

For every kernel (PTX .entry) of the PTX files given, compiled for sm_90 by the build (target
kvserve_cuda_ptx, tests/kernels/cuda/CMakeLists.txt), this runs `ptxas -arch=sm_90 -v` and checks
what it reports -- registers per thread, static shared memory, the local (stack) frame, spill
stores and loads -- and the PTX text itself (instructions a kernel must or must not contain)
against the budget file. No GPU is needed: ptxas is the assembler the driver would run.

Rules (the budget file's header explains its syntax):
  - every kernel has a register and a static shared-memory budget, and keeps to it;
  - no kernel spills (spill stores and loads are 0, always);
  - the stack frame is 0 unless the budget states a size;
  - `require` / `forbid` lines name instructions (regular expressions over the PTX of the kernel
    and of the functions it calls) that matching kernels must / must not contain;
  - every rule matches at least one kernel: a kernel named by the budgets that the PTX lacks (not
    written yet, renamed, removed) fails the audit, as does a kernel without a budget.

After checking the real kernels, the audit tampers with their real ptxas output and PTX (a spill,
one register over budget, a required instruction removed) and checks that each tampered copy
fails: an audit whose parser no longer understands this toolkit's ptxas cannot pass silently.
--self-test does the same on built-in samples and needs no CUDA toolkit.

Usage:
  kernel_audit.py --budgets FILE --ptxas PTXAS --ptx "a.ptx;b.ptx" [--arch sm_90] [--jobs N]
                  [--cache-dir DIR | --no-cache]
  kernel_audit.py --self-test [--budgets FILE]
Exit status: 0 when every rule holds, 1 when one does not (each failure is printed on a line of
its own: the rule, the kernel, measured vs budget), 2 for a usage error or a broken budget file.
"""

import argparse
import concurrent.futures
import dataclasses
import fnmatch
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time

# ---- The budget file ----------------------------------------------------------------------------

# Keys a `kernel` line may state, and what each limits.
LIMIT_KEYS = {
    "regs": "registers per thread",
    "smem": "static shared memory bytes",
    "stack": "stack (local) frame bytes",
}


@dataclasses.dataclass
class Rule:
    """One line of the budget file."""

    kind: str  # "kernel", "require" or "forbid"
    pattern: str  # glob over the kernel's short name (Name<args>) or its base name (Name)
    line: int
    why: str  # the line's trailing comment
    limits: dict = dataclasses.field(default_factory=dict)  # kernel: key -> int
    dynamic_smem: bool = None  # kernel: whether it must / must not use dynamic shared memory
    regex: re.Pattern = None  # require / forbid
    regex_text: str = ""

    def where(self, path):
        return f"{os.path.basename(path)}:{self.line}"


class BudgetError(Exception):
    pass


def parse_budgets(text, path="kernel_budgets.txt"):
    """The rules of a budget file. Raises BudgetError naming the line of a malformed one."""
    rules = []
    for number, raw in enumerate(text.splitlines(), 1):
        # A comment starts with '#' at the start of the line or after whitespace (regexes hold
        # no whitespace: they write \s).
        body, why = raw, ""
        m = re.search(r"(^|\s)#(.*)$", raw)
        if m:
            body, why = raw[: m.start()], m.group(2).strip()
        words = body.split()
        if not words:
            continue
        kind = words[0]
        if kind not in ("kernel", "require", "forbid") or len(words) < 3:
            raise BudgetError(
                f"{path}:{number}: expected 'kernel PATTERN key=value...', 'require PATTERN REGEX' "
                f"or 'forbid PATTERN REGEX', got: {raw.strip()}")
        rule = Rule(kind=kind, pattern=words[1], line=number, why=why)
        if kind == "kernel":
            for item in words[2:]:
                key, eq, value = item.partition("=")
                if key == "dynamic_smem" and value in ("yes", "no"):
                    rule.dynamic_smem = value == "yes"
                elif key in LIMIT_KEYS and eq and re.fullmatch(r"\d+", value):
                    rule.limits[key] = int(value)
                else:
                    raise BudgetError(
                        f"{path}:{number}: '{item}' is not one of regs=N, smem=N, stack=N, "
                        f"dynamic_smem=yes|no")
            if "regs" not in rule.limits or "smem" not in rule.limits:
                raise BudgetError(f"{path}:{number}: a kernel line states regs=N and smem=N")
        else:
            if len(words) != 3:
                raise BudgetError(
                    f"{path}:{number}: {kind} takes one pattern and one regular expression (write "
                    f"whitespace as \\s), got: {raw.strip()}")
            rule.regex_text = words[2]
            try:
                rule.regex = re.compile(words[2], re.MULTILINE)
            except re.error as e:
                raise BudgetError(f"{path}:{number}: bad regular expression {words[2]}: {e}")
        rules.append(rule)
    if not any(r.kind == "kernel" for r in rules):
        raise BudgetError(f"{path}: no kernel lines")
    return rules


# ---- ptxas -v output ----------------------------------------------------------------------------


@dataclasses.dataclass
class Resources:
    """What ptxas -v reports for one function."""

    entry: bool = False
    regs: int = None
    smem: int = 0
    stack: int = None
    spill_stores: int = None
    spill_loads: int = None
    barriers: int = 0
    cumulative_stack: int = 0


def parse_ptxas(log):
    """Mangled function name -> Resources, from ptxas -v output (CUDA 11-13 formats)."""
    funcs = {}
    current = None  # the entry whose "Used ..." line comes next
    props = None  # the function whose "N bytes stack frame" line comes next
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = m.group(1)
            funcs.setdefault(current, Resources()).entry = True
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            props = m.group(1)
            funcs.setdefault(props, Resources())
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      line)
        if m and props is not None:
            r = funcs[props]
            r.stack, r.spill_stores, r.spill_loads = (int(g) for g in m.groups())
            props = None
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and current is not None:
            r = funcs[current]
            r.regs = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            r.smem = int(s.group(1)) if s else 0
            b = re.search(r"used (\d+) barriers", line)
            r.barriers = int(b.group(1)) if b else 0
            c = re.search(r"(\d+) bytes cumulative stack size", line)
            r.cumulative_stack = int(c.group(1)) if c else 0
            current = None
    return funcs


# ---- PTX text ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Entry:
    """One kernel of a PTX file."""

    mangled: str
    source: str  # the .cu file it came from
    body: str  # its instructions and those of every .func it calls (transitively)
    dynamic_smem: bool


def _strip_comments(ptx):
    ptx = re.sub(r"/\*.*?\*/", " ", ptx, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", "", ptx)


_BRACE = re.compile(r"[{}]")
_BODY_OR_PROTOTYPE = re.compile(r"[{;]")


def _bodies(ptx, keyword):
    """name -> body text of every `.entry` or `.func` definition (declarations skipped)."""
    out = {}
    for m in re.finditer(r"\." + keyword + r"\s+(?:\([^)]*\)\s*)?([A-Za-z_$%][\w$.]*)\s*\(", ptx):
        i = ptx.find(")", m.end())  # the end of the parameter list
        # Performance directives (.maxntid ...) come before the body; a ';' first: a prototype.
        start = _BODY_OR_PROTOTYPE.search(ptx, i + 1)
        if start is None or start.group(0) == ";":
            continue
        depth, end = 0, len(ptx)
        for b in _BRACE.finditer(ptx, start.start()):
            depth += 1 if b.group(0) == "{" else -1
            if depth == 0:
                end = b.end()
                break
        out[m.group(1)] = ptx[start.start():end]
    return out


@functools.lru_cache(maxsize=64)
def parse_ptx(ptx, source):
    """The kernels of one PTX file (cached: the tamper checks parse each file again)."""
    ptx = _strip_comments(ptx)
    entries = _bodies(ptx, "entry")
    funcs = _bodies(ptx, "func")
    extern_shared = re.findall(r"\.extern\s+\.shared\s+[^;]*?([A-Za-z_$][\w$]*)\s*\[\s*\]\s*;", ptx)
    out = []
    for name, body in entries.items():
        # Inline what the kernel calls, so that rules see a non-inlined helper's instructions.
        seen, todo, text = set(), [body], [body]
        while todo:
            for callee in re.findall(r"\bcall(?:\.uni)?\s+(?:\([^)]*\)\s*,\s*)?([\w$.]+)",
                                     todo.pop()):
                if callee in funcs and callee not in seen:
                    seen.add(callee)
                    todo.append(funcs[callee])
                    text.append(funcs[callee])
        joined = "\n".join(text)
        dynamic = any(re.search(r"\b" + re.escape(s) + r"\b", joined) for s in extern_shared)
        out.append(Entry(name, source, joined, dynamic))
    return tuple(out)


# ---- Names ---------------------------------------------------------------------------------------


def demangle(names):
    """Mangled -> demangled, with c++filt (binutils; one process for all names)."""
    names = list(names)
    tool = shutil.which("c++filt")
    if tool is None:
        raise BudgetError("c++filt (binutils) not found: kernel names cannot be read")
    out = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True, text=True,
                         check=True).stdout.splitlines()
    if len(out) != len(names):
        raise BudgetError("c++filt returned a different number of names")
    return dict(zip(names, out))


def short_name(demangled):
    """'void kvserve::cuda::(anonymous namespace)::DecodeKernel<(kvserve::KvCacheDType)0, 8>(...)'
    -> ('DecodeKernel<(KvCacheDType)0,8>', 'DecodeKernel')."""
    s = demangled
    if s.startswith("void "):
        s = s[len("void "):]
    if s.endswith(")"):  # drop the parameter list: the last parenthesis group at depth 0
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[i], 0)
            if depth == 0:
                s = s[:i]
                break
    s = s.replace("(anonymous namespace)::", "")
    s = re.sub(r"\bkvserve::(?:cuda::|cpu::)?", "", s)
    s = re.sub(r",\s+", ",", s)  # no whitespace: a budget pattern is one word
    # The base name: the part before the template arguments, after the last '::' at depth 0.
    depth, cut = 0, len(s)
    for i, ch in enumerate(s):
        if ch == "<":
            if depth == 0:
                cut = i
                break
            depth += 1
        elif ch == ">":
            depth -= 1
    head = s[:cut]
    base = head.rsplit("::", 1)[-1]
    return s, base


# ---- The audit -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Kernel:
    name: str  # short name, e.g. DecodeKernel<(KvCacheDType)0,8>
    base: str  # DecodeKernel
    entry: Entry
    res: Resources


def matches(rule, kernel):
    return fnmatch.fnmatchcase(kernel.name, rule.pattern) or fnmatch.fnmatchcase(
        kernel.base, rule.pattern)


def check(kernels, rules, budget_path):
    """Failure lines (empty: all rules hold), and the effective budget of each kernel."""
    failures = []
    budgets = {}
    used = {id(r): False for r in rules}
    for k in kernels:
        label = f"{k.name} ({k.entry.source})"
        r = k.res
        for rule in rules:
            if matches(rule, k):
                used[id(rule)] = True
        if r.regs is None or r.stack is None:
            failures.append(f"{label}: ptxas -v output not understood (no 'Used N registers' or "
                            f"'bytes stack frame' line for {k.entry.mangled}): update the parser")
            continue
        mine = [rule for rule in rules if rule.kind == "kernel" and matches(rule, k)]
        if not mine:
            failures.append(f"{label}: no budget: add a 'kernel' line for it to "
                            f"{os.path.basename(budget_path)} (regs {r.regs}, smem {r.smem}, "
                            f"stack {r.stack} measured)")
            continue
        limit = {}
        source = {}
        for rule in mine:
            for key, value in rule.limits.items():
                if key not in limit or value < limit[key]:
                    limit[key], source[key] = value, rule
        limit.setdefault("stack", 0)
        budgets[k.name] = limit
        where = lambda key: (source[key].where(budget_path) if key in source
                             else "the default: no stack frame unless a budget states one")
        if r.regs > limit["regs"]:
            failures.append(f"{label}: registers {r.regs} > budget {limit['regs']} "
                            f"({where('regs')})")
        if r.smem > limit["smem"]:
            failures.append(f"{label}: static shared memory {r.smem} bytes > budget "
                            f"{limit['smem']} ({where('smem')})")
        if r.stack > limit["stack"]:
            failures.append(f"{label}: stack frame {r.stack} bytes > budget {limit['stack']} "
                            f"({where('stack')})")
        if r.spill_stores or r.spill_loads:
            failures.append(f"{label}: spills to local memory ({r.spill_stores} bytes spill "
                            f"stores, {r.spill_loads} bytes spill loads) > budget 0 (no kernel "
                            f"spills)")
        for rule in mine:
            if rule.dynamic_smem is not None and rule.dynamic_smem != k.entry.dynamic_smem:
                used_now = "used" if k.entry.dynamic_smem else "not used"
                wanted = "yes" if rule.dynamic_smem else "no"
                failures.append(f"{label}: dynamic shared memory {used_now}, budget says "
                                f"dynamic_smem={wanted} ({rule.where(budget_path)})")
        for rule in rules:
            if rule.kind == "kernel" or not matches(rule, k):
                continue
            hit = rule.regex.search(k.entry.body)
            why = f": {rule.why}" if rule.why else ""
            if rule.kind == "require" and not hit:
                failures.append(f"{label}: required instruction missing: no match for "
                                f"/{rule.regex_text}/ in its PTX ({rule.where(budget_path)}{why})")
            if rule.kind == "forbid" and hit:
                failures.append(f"{label}: forbidden instruction: '{hit.group(0).strip()}' matches "
                                f"/{rule.regex_text}/ ({rule.where(budget_path)}{why})")
    for rule in rules:
        if not used[id(rule)]:
            why = f" ({rule.why})" if rule.why else ""
            failures.append(f"{rule.where(budget_path)}: {rule.kind} {rule.pattern}: no such "
                            f"kernel in the PTX of kernels/cuda/*.cu (not written yet, renamed or "
                            f"removed?){why}")
    return failures, budgets


def collect(ptx_texts, ptxas_logs):
    """Kernels from {source: ptx text} and {source: ptxas -v log}. Raises BudgetError when the
    two disagree about which kernels there are (the parser is out of date then)."""
    entries = []
    resources = {}
    for source, text in ptx_texts.items():
        found = parse_ptx(text, source)
        res = parse_ptxas(ptxas_logs[source])
        compiled = {n for n, r in res.items() if r.entry}
        names = {e.mangled for e in found}
        if names != compiled:
            raise BudgetError(
                f"{source}: the PTX's kernels and ptxas's do not agree (parser out of date?): "
                f"only in the PTX: {sorted(names - compiled)}; only in ptxas: "
                f"{sorted(compiled - names)}")
        entries += found
        for e in found:
            resources[(source, e.mangled)] = res[e.mangled]
    names = demangle({e.mangled for e in entries})
    kernels = []
    for e in entries:
        name, base = short_name(names[e.mangled])
        kernels.append(Kernel(name, base, e, resources[(e.source, e.mangled)]))
    kernels.sort(key=lambda k: (k.entry.source, k.name))
    return kernels


def table(kernels, budgets):
    rows = [("kernel", "file", "regs", "smem", "stack", "spill st/ld", "dyn smem", "barriers")]
    for k in kernels:
        b = budgets.get(k.name, {})
        r = k.res
        cell = lambda v, key: f"{v}/{b[key]}" if key in b else f"{v}/-"
        rows.append((k.name, k.entry.source, cell(r.regs, "regs"), cell(r.smem, "smem"),
                     cell(r.stack, "stack"), f"{r.spill_stores}/{r.spill_loads}",
                     "yes" if k.entry.dynamic_smem else "no", str(r.barriers)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
                     for row in rows)


# ---- Tampering: the audit must fail on broken input ---------------------------------------------


def tamper_checks(ptx_texts, logs, rules, budget_path):
    """(description, failed as expected) for tampered copies of the real inputs."""
    kernels = collect(ptx_texts, logs)
    _, budgets = check(kernels, rules, budget_path)
    results = []
    budgeted = [k for k in kernels if k.name in budgets]
    if not budgeted:
        return [("at least one budgeted kernel to tamper with", False)]
    k = budgeted[0]
    src, mangled = k.entry.source, k.entry.mangled

    def run(what, texts, new_logs, expect):
        try:
            failures, _ = check(collect(texts, new_logs), rules, budget_path)
        except BudgetError as e:
            failures = [str(e)]
        results.append((what, any(expect in f for f in failures)))

    # A spill: the kernel's "0 bytes spill stores" line says 8.
    pat = re.compile(r"(Function properties for " + re.escape(mangled) +
                     r"\s*\n[^\n]*?)\b0 bytes spill stores")
    log, n = pat.subn(r"\g<1>8 bytes spill stores", logs[src], count=1)
    if n == 1:
        run(f"spill stores in {k.name}", ptx_texts, {**logs, src: log}, "spills to local memory")
    else:
        results.append((f"find the spill line of {k.name} in the real ptxas output", False))
    # One register over budget.
    pat = re.compile(r"(Compiling entry function '" + re.escape(mangled) +
                     r"'.*?Used )\d+( registers)", re.DOTALL)
    log, n = pat.subn(r"\g<1>" + str(budgets[k.name]["regs"] + 1) + r"\g<2>", logs[src], count=1)
    if n == 1:
        run(f"{budgets[k.name]['regs'] + 1} registers in {k.name}", ptx_texts,
            {**logs, src: log}, "registers")
    else:
        results.append((f"find the register line of {k.name} in the real ptxas output", False))
    # Each required instruction present today, taken out of the PTX.
    for rule in rules:
        if rule.kind != "require":
            continue
        victims = [x for x in kernels if matches(rule, x) and rule.regex.search(x.entry.body)]
        if not victims:
            continue
        v = victims[0]
        text = "\n".join(line for line in ptx_texts[v.entry.source].splitlines()
                         if not rule.regex.search(line))
        run(f"/{rule.regex_text}/ removed from {v.name}", {**ptx_texts, v.entry.source: text},
            logs, "required instruction missing")
    return results


# ---- Self-test on built-in samples ---------------------------------------------------------------

SAMPLE_BUDGETS = r"""
# Sample budgets (the self-test).
kernel  ArgMaxKernel      regs=24  smem=3072                  # one block per row
kernel  PagedDecodeKernel regs=128 smem=0    dynamic_smem=yes
require PagedDecodeKernel \bcp\.async\.cg\.shared\.global(?:\.[\w:]+)*\s+\[[^\]]+\],\s*\[[^\]]+\],\s*16\b  # 128-bit copies
require PagedDecodeKernel \bld\.shared\.v4\.
forbid  PagedDecodeKernel \bld\.global(?:\.(?!v[248]\b)[\w:]+)*\.[bsu]16\b  # no 2-byte loads
kernel  PrefillMmaKernel  regs=168 smem=0 stack=16
require PrefillMmaKernel  \bmma\.sync\.aligned\.m16n8k16\.
require PrefillMmaKernel  \bldmatrix\.sync\.aligned\.
"""

A = "_ZN7kvserve4cuda12_GLOBAL__N_112ArgMaxKernelEPKfllPi"
D = "_ZN7kvserve4cuda12_GLOBAL__N_117PagedDecodeKernelILi0EEEvPKt"
P = "_ZN7kvserve4cuda12_GLOBAL__N_116PrefillMmaKernelILi128EEEvPKf"

SAMPLE_PTX = {
    "decode.cu": f"""
.version 9.0
.target sm_90
.extern .shared .align 16 .b8 smem[];
.func (.param .b32 func_retval0) _Z6helperv()
{{
\tld.global.f32 \t%f1, [%rd1];
\tret;
}}
.entry {D}(
\t.param .u64 p0
)
.maxntid 128, 1, 1
{{
\t.reg .b64 %rd<9>;
\tmov.u64 \t%rd1, smem;
\t// a comment: ld.global.u16 here is not an instruction
\tcp.async.cg.shared.global [%r1], [%rd2], 16, %r3;
\tcp.async.commit_group;
\tld.shared.v4.u32 \t{{%r4, %r5, %r6, %r7}}, [%r8];
\t{{ .reg .b32 %tmp; mov.u32 %tmp, 0; }}
\tcall.uni (retval0), _Z6helperv, ();
\tret;
}}
""",
    "prefill.cu": f"""
.version 9.0
.target sm_90
.entry {P}(
\t.param .u64 p0
)
{{
\tldmatrix.sync.aligned.m8n8.x4.shared.b16 {{%r1, %r2, %r3, %r4}}, [%r5];
\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{%f1, %f2, %f3, %f4}}, {{%r1, %r2, %r3, %r4}}, {{%r6, %r7}}, {{%f1, %f2, %f3, %f4}};
\tret;
}}
.entry {A}(
\t.param .u64 p0
)
{{
\tld.global.f32 \t%f1, [%rd1];
\tret;
}}
""",
}

SAMPLE_LOGS = {
    "decode.cu": f"""ptxas info    : 0 bytes gmem
ptxas info    : Function properties for _Z6helperv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '{D}' for 'sm_90'
ptxas info    : Function properties for {D}
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 96 registers, used 1 barriers
ptxas info    : Compile time = 10.0 ms
""",
    # The older format (CUDA 11/12): "N bytes smem, N bytes cmem[0]".
    "prefill.cu": f"""ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '{P}' for 'sm_90'
ptxas info    : Function properties for {P}
    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 160 registers, used 1 barriers, 16 bytes cumulative stack size
ptxas info    : Compiling entry function '{A}' for 'sm_90'
ptxas info    : Function properties for {A}
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 16 registers, 3072 bytes smem, 400 bytes cmem[0]
""",
}


def self_test(budget_path):
    """Runs the checks on the samples, clean and tampered; returns the number of failed cases."""
    rules = parse_budgets(SAMPLE_BUDGETS, "sample_budgets.txt")
    bad = 0

    def case(what, ptx=None, logs=None, budgets=None, expect=None):
        nonlocal bad
        try:
            rs = parse_budgets(budgets, "sample_budgets.txt") if budgets is not None else rules
            failures, _ = check(collect(ptx or SAMPLE_PTX, logs or SAMPLE_LOGS), rs,
                                "sample_budgets.txt")
        except BudgetError as e:
            failures = [f"(error) {e}"]
        if expect is None:
            ok = not failures
        else:
            ok = any(expect in f for f in failures)
        print(f"  {'ok  ' if ok else 'FAIL'} {what}: " +
              ("; ".join(failures) if failures else "passes"))
        if not ok:
            bad += 1
            print(f"       expected {'no failure' if expect is None else repr(expect)}")

    def sub(d, key, old, new):
        assert old in d[key], (key, old)
        return {**d, key: d[key].replace(old, new, 1)}

    print("self-test: the audit on built-in samples (each line: what was tampered, the verdict)")
    case("clean samples pass")
    case("spill stores",
         logs=sub(SAMPLE_LOGS, "decode.cu",
                  "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
                  "ptxas info    : Used 96",
                  "0 bytes stack frame, 24 bytes spill stores, 24 bytes spill loads\n"
                  "ptxas info    : Used 96"),
         expect="PagedDecodeKernel<0> (decode.cu): spills to local memory (24 bytes spill stores")
    case("registers over budget", logs=sub(SAMPLE_LOGS, "decode.cu", "Used 96 registers",
                                           "Used 200 registers"),
         expect="PagedDecodeKernel<0> (decode.cu): registers 200 > budget 128")
    case("static shared memory over budget (old ptxas format)",
         logs=sub(SAMPLE_LOGS, "prefill.cu", "3072 bytes smem", "4096 bytes smem"),
         expect="ArgMaxKernel (prefill.cu): static shared memory 4096 bytes > budget 3072")
    case("stack frame over its stated budget",
         logs=sub(SAMPLE_LOGS, "prefill.cu", "16 bytes stack frame", "32 bytes stack frame"),
         expect="PrefillMmaKernel<128> (prefill.cu): stack frame 32 bytes > budget 16")
    case("stack frame where none is stated",
         logs=sub(SAMPLE_LOGS, "prefill.cu",
                  "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
                  "ptxas info    : Used 16",
                  "8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
                  "ptxas info    : Used 16"),
         expect="ArgMaxKernel (prefill.cu): stack frame 8 bytes > budget 0")
    case("mma missing", ptx=sub(SAMPLE_PTX, "prefill.cu", "mma.sync.aligned.m16n8k16",
                                "mma.sync.aligned.m16n8k8"),
         expect="PrefillMmaKernel<128> (prefill.cu): required instruction missing: no match for "
                "/\\bmma")
    case("ldmatrix missing", ptx=sub(SAMPLE_PTX, "prefill.cu", "ldmatrix", "ld.shared.v4"),
         expect="required instruction missing: no match for /\\bldmatrix")
    case("cp.async of 8 bytes, not 16",
         ptx=sub(SAMPLE_PTX, "decode.cu", "[%rd2], 16, %r3", "[%rd2], 8, %r3"),
         expect="PagedDecodeKernel<0> (decode.cu): required instruction missing: no match for "
                "/\\bcp\\.async")
    case("no ld.shared.v4", ptx=sub(SAMPLE_PTX, "decode.cu", "ld.shared.v4.u32", "ld.shared.u32"),
         expect="required instruction missing: no match for /\\bld\\.shared\\.v4")
    case("scalar 16-bit global load in a called function",
         ptx=sub(SAMPLE_PTX, "decode.cu", "ld.global.f32 \t%f1", "ld.global.nc.u16 \t%rs1"),
         expect="PagedDecodeKernel<0> (decode.cu): forbidden instruction: 'ld.global.nc.u16'")
    case("ld.global.b16", ptx=sub(SAMPLE_PTX, "decode.cu", "ld.global.f32 \t%f1",
                                  "ld.global.L1::no_allocate.b16 \t%rs1"),
         expect="forbidden instruction: 'ld.global.L1::no_allocate.b16'")
    case("a vector load of 16-bit elements is allowed",
         ptx=sub(SAMPLE_PTX, "decode.cu", "ld.global.f32 \t%f1", "ld.global.v4.u16 \t{%rs1}"))
    case("dynamic shared memory no longer used",
         ptx=sub(SAMPLE_PTX, "decode.cu", "mov.u64 \t%rd1, smem;", ""),
         expect="dynamic shared memory not used, budget says dynamic_smem=yes")
    case("the paged decode kernel missing",
         ptx={**SAMPLE_PTX, "decode.cu": ".version 9.0\n"},
         logs={**SAMPLE_LOGS, "decode.cu": "ptxas info    : 0 bytes gmem\n"},
         expect="sample_budgets.txt:4: kernel PagedDecodeKernel: no such kernel")
    case("a kernel without a budget",
         budgets=SAMPLE_BUDGETS.replace("kernel  ArgMaxKernel", "kernel  ArgMinKernel"),
         expect="ArgMaxKernel (prefill.cu): no budget")
    case("ptxas output not understood",
         logs=sub(SAMPLE_LOGS, "decode.cu", "Used 96 registers", "Utilised 96 registers"),
         expect="ptxas -v output not understood")
    case("PTX and ptxas disagree",
         logs={**SAMPLE_LOGS, "decode.cu": "ptxas info    : 0 bytes gmem\n"},
         expect="do not agree")
    case("template arguments in a pattern",
         budgets=SAMPLE_BUDGETS + "kernel PrefillMmaKernel<128> regs=150 smem=0\n",
         expect="PrefillMmaKernel<128> (prefill.cu): registers 160 > budget 150")
    for text, expect in [("kernel X regs=1\n", "states regs=N and smem=N"),
                         ("kernel X regs=1 smem=2 spills=3\n", "'spills=3' is not one of"),
                         ("require X\n", "expected"), ("forbid X a b\n", "one regular expression"),
                         ("kernel X regs=1 smem=1\nrequire X (\n", "bad regular expression")]:
        try:
            parse_budgets(text, "t.txt")
            ok = False
        except BudgetError as e:
            ok = expect in str(e)
        print(f"  {'ok  ' if ok else 'FAIL'} malformed budget line {text.strip()!r} is rejected")
        bad += not ok
    if budget_path:
        try:
            parse_budgets(open(budget_path).read(), budget_path)
            print(f"  ok   {budget_path} parses")
        except BudgetError as e:
            print(f"  FAIL {e}")
            bad += 1
    return bad


# ---- Main ----------------------------------------------------------------------------------------


def run_ptxas(ptxas, arch, path, cache_dir, version):
    """(exit status, ptxas -v output, whether it came from the cache). The cache maps the PTX's
    bytes, the architecture and ptxas's version to the output of an earlier, successful run: the
    output of identical input, so the audit checks the same thing. It saves the ~15 s ptxas spends
    on the decode kernels' many instances whenever they did not change (CI keeps ~/.cache)."""
    with open(path, "rb") as f:
        ptx = f.read()
    key = hashlib.sha256("\0".join([version, arch, "-v"]).encode() + b"\0" + ptx).hexdigest()
    entry = os.path.join(cache_dir, key + ".txt") if cache_dir else None
    if entry and os.path.isfile(entry):
        try:
            with open(entry) as f:
                log = f.read()
            os.utime(entry)
            return 0, log, True
        except OSError:
            pass
    p = subprocess.run([ptxas, f"-arch={arch}", "-v", path, "-o", os.devnull],
                       capture_output=True, text=True)
    log = p.stdout + p.stderr
    if entry and p.returncode == 0:
        try:
            os.makedirs(cache_dir, exist_ok=True)
            tmp = f"{entry}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(log)
            os.replace(tmp, entry)
        except OSError:
            pass  # a cache that cannot be written only costs time
    return p.returncode, log, False


def prune_cache(cache_dir, keep=400):
    """Keeps the `keep` most recently used entries."""
    try:
        entries = [os.path.join(cache_dir, n) for n in os.listdir(cache_dir) if n.endswith(".txt")]
        entries.sort(key=os.path.getmtime, reverse=True)
        for old in entries[keep:]:
            os.remove(old)
    except OSError:
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budgets", help="the budget file (kernels/cuda/kernel_budgets.txt)")
    ap.add_argument("--ptxas", help="ptxas to run (the toolkit's that compiled the PTX)")
    ap.add_argument("--ptx", help="PTX files, separated by ';' (or given several times)",
                    action="append", default=[])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--jobs", type=int, default=2, help="ptxas processes at once (default 2)")
    ap.add_argument("--cache-dir", default=os.environ.get(
        "KVSERVE_KERNEL_AUDIT_CACHE",
        os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                     "kvserve-kernel-audit")),
                    help="where ptxas outputs are kept, keyed by the PTX's hash (default: "
                         "$KVSERVE_KERNEL_AUDIT_CACHE, else ~/.cache/kvserve-kernel-audit)")
    ap.add_argument("--no-cache", action="store_true", help="always run ptxas")
    ap.add_argument("--self-test", action="store_true",
                    help="check the audit itself on built-in samples (no CUDA toolkit needed)")
    args = ap.parse_args()
    t0 = time.monotonic()
    if args.self_test:
        try:
            bad = self_test(args.budgets)
        except BudgetError as e:
            print(f"kernel audit self-test: {e}")
            return 2
        print(f"kernel audit self-test: {'PASS' if bad == 0 else f'FAIL ({bad} case(s))'}")
        return 0 if bad == 0 else 1
    if not args.budgets or not args.ptxas or not args.ptx:
        ap.error("--budgets, --ptxas and --ptx are needed (or --self-test)")
    try:
        rules = parse_budgets(open(args.budgets).read(), args.budgets)
    except (OSError, BudgetError) as e:
        print(f"kernel audit: {e}")
        return 2
    paths = [p for arg in args.ptx for p in arg.split(";") if p]
    sources = {}
    for p in paths:
        src = os.path.splitext(os.path.basename(p))[0] + ".cu"
        if src in sources:
            print(f"kernel audit: two PTX files for {src}: {sources[src]} and {p}")
            return 2
        sources[src] = p
    full_version = subprocess.run([args.ptxas, "--version"], capture_output=True,
                                  text=True).stdout
    version = [line for line in full_version.splitlines() if "release" in line]
    cache_dir = None if args.no_cache else args.cache_dir
    texts, logs, cached = {}, {}, 0
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {src: pool.submit(run_ptxas, args.ptxas, args.arch, p, cache_dir, full_version)
                   for src, p in sources.items()}
        for src, p in sources.items():
            with open(p) as f:
                texts[src] = f.read()
            rc, logs[src], hit = futures[src].result()
            cached += hit
            if rc != 0:
                print(f"kernel audit: ptxas failed on {p} (exit {rc}):\n{logs[src]}")
                return 1
    if cache_dir:
        prune_cache(cache_dir)
    warnings = [line for log in logs.values() for line in log.splitlines() if "warning" in line]
    try:
        kernels = collect(texts, logs)
        failures, budgets = check(kernels, rules, args.budgets)
        tampered = tamper_checks(texts, logs, rules, args.budgets)
    except BudgetError as e:
        print(f"kernel audit: {e}")
        return 1
    print(f"kernel audit: {len(kernels)} kernels in {len(sources)} PTX files, {args.arch}, "
          f"{version[-1] if version else args.ptxas}")
    print(f"ptxas -v: {len(sources) - cached} file(s) assembled, {cached} from the cache"
          f"{f' ({cache_dir})' if cache_dir else ''}")
    print(f"budgets: {args.budgets} (measured/budget; spills must be 0)")
    print(table(kernels, budgets))
    for w in warnings:
        print(f"ptxas: {w}")
    print("tamper checks (each tampered copy of the real ptxas output or PTX must fail):")
    for what, ok in tampered:
        print(f"  {'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            failures.append(f"tamper check: the audit did not catch: {what} (parser out of date?)")
    for f in failures:
        print(f"FAIL {f}")
    elapsed = time.monotonic() - t0
    if failures:
        print(f"kernel audit: FAIL ({len(failures)} rule(s) broken, {elapsed:.1f} s)")
        return 1
    print(f"kernel audit: PASS ({len(rules)} rules, {elapsed:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
