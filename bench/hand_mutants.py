"""Hand-applied mutants of the ninth to twenty-third sessions' fixes: each one removes or weakens
a fix's key line, and the tests named next to it must then fail (docs/testing.md).

    .venv/bin/python bench/hand_mutants.py [--commit HEAD] [--workdir DIR] [--only executor/] [--last N]

Runs in a scratch copy (`git archive`), never in the working tree; prints one line per
mutant (killed / SURVIVED / NOT FOUND when the code has changed since / ERROR when its test
selection is not one pytest can run) and exits non-zero if any survived, erred or was not found. Browser
tests (Chromium) are left out of the selections.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile

# (file, text of the fix, what the mutant puts there, tests to run)
MUTANTS = [
    # -- sixteenth session: a cached re-run digests configs without building them -------------
    *[
        ("executor/walker.py", fix, mutant, "tests/executor/test_lazy_config.py")
        for fix, mutant in [
            ('        and not hasattr(kind, "__post_init__")\n', "        and True\n"),
            ("            state[0] = True\n            value = on_marker", "            value = on_marker"),
            ("        state[0] = replaced_before\n", "        state[0] = False\n"),
            (
                "                return UNBUILT if _holds_marker(obj) else encode(obj, path, False, depth)",
                "                return encode(obj, path, False, depth)",
            ),
            ("        if kind is list or kind is tuple:", "        if kind is list:"),
            ('        and init.co_filename == "<string>"', "        and True"),
            ("        and kind.__new__ is object.__new__\n", "        and True\n"),
            ("        and all(init_field for _, init_field in fields)\n", "        and True\n"),
            ("        and type(kind).__call__ is type.__call__\n", "        and True\n"),
            (
                "    if state[0]:\n        if not rebuilt_as_is:",
                "    if False:\n        if not rebuilt_as_is:",
            ),
            ("    if fields is None or isinstance(obj, _NOT_PLAIN_OBJECTS):", "    if fields is None:"),
        ]
    ],
    (
        "executor/graph.py",
        '    return {"config_digest": sha256_hex(canonical_json(encoded)), "_builder": builder}',
        '    return {"config": _concrete_config(step, builder)}',
        "tests/executor/test_lazy_config.py",
    ),
    (
        "executor/graph.py",
        '    return {"config_digest": sha256_hex(canonical_json(encoded)), "_builder": builder}',
        '    return {"config_digest": sha256_hex(canonical_json(encoded[0] if 0 else {})), "_builder": builder}',
        "tests/executor/test_lazy_config.py",
    ),
    (
        "executor/executor.py",
        "        self.configs = ConfigsByDeclaration(graph)\n",
        "        self.configs = {d: graph.resolved(d).config for d in graph.declarations}\n",
        "tests/executor/test_lazy_config.py",
    ),
    # -- fifteenth session: what a pause made, promoted to the oldest generation -------------
    (
        "executor/collector.py",
        "if self.promote and not gc.get_freeze_count():",
        "if False:",
        "tests/executor/test_collector.py",
    ),
    (
        "executor/collector.py",
        "if self.promote and not gc.get_freeze_count():",
        "if self.promote:",
        "tests/executor/test_collector.py",
    ),
    (
        "executor/collector.py",
        "                gc.freeze()\n                gc.unfreeze()\n",
        "                gc.freeze()\n",
        "tests/executor/test_collector.py",
    ),
    (
        "executor/executor.py",
        "with CollectorPause(promote=True) as collector:",
        "with CollectorPause() as collector:",
        "tests/executor/test_collector.py",
    ),
    # (two survivors of the fifteenth session's mutmut sample)
    (
        "executor/executor.py",
        "if will_run or not self.store.exists(self.executor_info_path):",
        "if will_run and not self.store.exists(self.executor_info_path):",
        "tests/executor/test_mutation_guards.py",
    ),
    (
        "executor/executor.py",
        '"experiment": self.executor_info_path,',
        '"EXPERIMENT": self.executor_info_path,',
        "tests/executor/test_mutation_guards.py",
    ),
    # -- fourteenth session: the cached re-run's plan and console ----------------------------
    (
        "executor/plan.py",
        "if last.version_hash == step.version_hash and last.config_digest == step.config_digest:",
        "if last.config_digest == step.config_digest:",
        "tests/executor/test_cold_and_warm_trims.py tests/executor/test_mutation_guards.py",
    ),
    (
        "executor/plan.py",
        "if last.version_hash == step.version_hash and last.config_digest == step.config_digest:",
        "if last.version_hash == step.version_hash:",
        "tests/executor/test_cold_and_warm_trims.py",
    ),
    (
        "executor/plan.py",
        "cached_listed is not None and len(quiet) > cached_listed",
        "cached_listed is not None and len(quiet) >= cached_listed",
        "tests/executor/test_plan_display.py",
    ),
    (
        "executor/console.py",
        "            self.done.add(event.output_path)\n            return\n",
        "            return\n",
        "tests/executor/test_plan_display.py",
    ),
    (
        "marin/gc.py",
        "tree.contains(step.path) and not tree.reached_through_link(step.path)",
        "tree.contains(step.path)",
        "tests/marin",
    ),
    (
        "marin/gc.py",
        "        if step.status_unread:\n",
        "        if False:\n",
        "tests/marin/test_hostile_tree_readers.py",
    ),
    (
        "marin/gc.py",
        'other.path.startswith(step.path + "/")',
        'other.path.startswith(step.path + "/x")',
        "tests/marin/test_hostile_tree_readers.py",
    ),
    (
        "marin/outputs.py",
        "return not self.history and any(",
        "return any(",
        "tests/marin/test_hostile_tree_readers.py tests/marin/test_untrusted_trees.py tests/marin/test_cli.py",
    ),
    (
        "marin/outputs.py",
        "return os.path.realpath(local) != os.path.join(self._real_prefix, relative)",
        "return False",
        "tests/marin",
    ),
    (
        "marin/outputs.py",
        "        return not self.leads_outside(path)\n\n    def _first_visit",
        "        return False\n\n    def _first_visit",
        "tests/marin",
    ),
    (
        "marin/outputs.py",
        "        if real in seen:\n            return False",
        "        if real in seen:\n            return True",
        "tests/marin/test_hostile_tree_readers.py",
    ),
    (
        "executor/lease.py",
        "return age > timeout or age < -MAX_CLOCK_AHEAD_S",
        "return age > timeout",
        "tests/marin/test_hostile_tree_readers.py tests/executor/test_mutants_lease.py",
    ),
    (
        "executor/tree.py",
        "and 0 <= value <= MAX_TIMESTAMP",
        "and -1e30 <= value <= MAX_TIMESTAMP",
        "tests/marin/test_hostile_tree_readers.py",
    ),
    ("executor/lease.py", "if value < MIN_SECONDS:", "if value < 0:", "tests/executor/test_mutants_lease.py"),
    (
        "executor/main.py",
        "        if name in found:\n",
        "        if False:\n",
        "tests/executor/test_flags.py",
    ),
    (
        "executor/main.py",
        "return matches[0] if len(matches) == 1 else name",
        "return name",
        "tests/executor/test_flags.py",
    ),
    (
        "executor/graph.py",
        "if storage_of(override) != storage_of(prefix):",
        "if False:",
        "tests/executor/test_bad_input.py tests/executor/test_versioning.py",
    ),
    (
        "executor/graph.py",
        "            sha256_hex(canonical_json(value))\n",
        "            canonical_json(value)\n",
        "tests/executor/test_bad_input.py",
    ),
    (
        "executor/runner.py",
        "                if last is not None or (not row.absent and self._found_files(path)):",
        "                if not row.absent and self._found_files(path):",
        "tests/executor/test_temp_files_after_failure.py",
    ),
    (
        "executor/tree.py",
        r'LEFTOVER_TEMP_NAME = r"\.tmp-[0-9a-f]+-(?!\.executor)"',
        r'LEFTOVER_TEMP_NAME = r"\.tmp-[0-9a-f]+-"',
        "tests/executor/test_temp_files_after_failure.py",
    ),
    ("executor/terminal.py", '.replace("\\r", "\\n")', "", "tests/marin/test_hostile_tree_readers.py"),
    (
        "executor/console.py",
        "            os.dup2(devnull, sys.stdout.fileno())\n",
        "            pass\n",
        "tests/executor/test_console_and_signals.py",
    ),
    (
        "executor/logs.py",
        "return len(text) if self._original is None else self._original.write(text)",
        "return self._original.write(text)",
        "tests/executor/test_console_and_signals.py tests/executor/test_mutants_logs.py",
    ),
    (
        "executor/logs.py",
        "os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK",
        "os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK",
        "tests/executor/test_status_file_kinds.py",
    ),
    (
        "marin/web/server.py",
        "self._reader.deadline = time.monotonic() + self.timeout",
        "self._reader.deadline = None",
        "tests/marin/test_web_limits.py -k trickling",
    ),
    (
        "marin/web/files.py",
        "    except ImportError as error:\n        raise MissingPackage",
        "    except ValueError as error:\n        raise MissingPackage",
        "tests/marin/test_web.py -k missing",
    ),
    (
        "executor/executor.py",
        "if storage_of(self.executor_info_base_path) != storage_of(self.prefix):",
        "if False:",
        "tests/executor/test_bad_input.py tests/executor/test_flags.py",
    ),
    (
        "marin/cli.py",
        "        return REBUILD_FAILED\n",
        "        raise\n",
        "tests/marin/test_hostile_tree_readers.py",
    ),
    (
        "operations/shards.py",
        "raise _worker_died(jobs, results) from broken",
        "raise",
        "tests/operations/test_shards.py -k rerun_after",
    ),
    (
        "marin/outputs.py",
        "        except OSError as error:  # a link loop (ELOOP), a socket (ENXIO), no permission, ...\n            raise TreeFileError",
        "        except ValueError as error:\n            raise TreeFileError",
        "tests/marin",
    ),
    # -- nineteenth session: keeper messages built without json.dumps; a lease's directory first
    *[
        ("executor/lease_keeper.py", fix, mutant, "tests/executor/test_lease_keeper.py")
        for fix, mutant in [
            ('{"null" if worker is None else _quote(worker)}', '{_quote(worker or "")}'),
            ('_quote(data.decode("latin-1"))', '_quote(data.decode("utf-8", "replace"))'),
            ("{float(interval)!r}", "{int(interval)}"),
            ('    return (text + "}\\n").encode()', '    return (text + "}").encode()'),
        ]
    ],
    (
        "executor/store.py",
        "            if make_directory:\n                _make_directory(directory)\n",
        "            if make_directory:\n                pass\n",
        "tests/executor/test_store_contract.py tests/executor/test_cold_and_warm_trims.py -k 'creates or made_before'",
    ),
    # -- eighteenth session: workers' reports wake the scheduler only when it has work --------
    *[
        ("executor/runner.py", fix, mutant, "tests/executor/test_report_batching.py")
        for fix, mutant in [
            ("        wake = not result[0].ok\n", "        wake = False\n"),
            ("                wake = len(self._queued) <= QUEUE_LOW\n", "                wake = False\n"),
            ("len(self._blockers[child]) <= 1", "len(self._blockers[child]) < 1"),
        ]
    ],
    (
        "executor/runner.py",
        "                self._last_take = time.monotonic()\n",
        "                pass\n",
        "tests/executor/test_worker_pool.py",
    ),
    # -- tenth session: worker threads started as steps wait, and the pinned mutmut survivors
    (
        "executor/runner.py",
        "            if starved:\n                self._workers += 1\n        if starved:\n            self._start_worker()",
        "            if starved:\n                self._workers += 1\n        if False:\n            self._start_worker()",
        "tests/executor/test_worker_pool.py",
    ),
    (
        "executor/runner.py",
        "if not self._queued or self._workers >= self.max_concurrent:",
        "if not self._queued or self._workers >= self.max_concurrent - 1:",
        "tests/executor/test_worker_pool.py tests/executor/test_mutants_runner.py",
    ),
    (
        "executor/runner.py",
        "return len(self._queued) < self._idle + QUEUE_AHEAD",
        "return True",
        "tests/executor/test_worker_pool.py",
    ),
    (
        "executor/executor.py",
        "                    leases.wait_ready()",
        "                    pass",
        "tests/executor/test_worker_pool.py",
    ),
    (
        "executor/runner.py",
        "heartbeat=holder.heartbeat",
        "heartbeat=None",
        "tests/executor/test_leases.py::test_a_second_executor_waits_for_the_first_and_then_skips",
    ),
    (
        "executor/executor.py",
        "                        started,\n                        outcomes,",
        "                        None,\n                        outcomes,",
        "tests/executor/test_mutation_guards.py::test_a_cached_rerun_rewrites_a_missing_manifest_with_its_start_date_and_provenance",
    ),
    (
        "executor/runner.py",
        'earlier attempt left", row.name, removed)',
        'earlier attempt left", removed)',
        "tests/executor/test_temp_files_after_failure.py",
    ),
    # -- eleventh session: hostile trees, input and signals --
    (
        "marin/reproduce.py",
        "    _refuse_working_directory_in(tree)\n",
        "",
        "tests/marin/test_untrusted_trees.py",
    ),
    (
        "executor/template.py",
        'if "__main__" in parts:',
        "if False:",
        "tests/executor/test_template.py",
    ),
    (
        "executor/template.py",
        "and parts[0] not in sys.modules:",
        "and False:",
        "tests/executor/test_template.py",
    ),
    (
        "marin/web/files.py",
        "if not stat.S_ISREG(os.fstat(fd).st_mode):",
        "if stat.S_ISDIR(os.fstat(fd).st_mode):",
        "tests/marin/test_web_limits.py",
    ),
    (
        "marin/web/parquet_preview.py",
        '        "-P",\n',
        "",
        "tests/marin/test_web_limits.py",
    ),
    (
        "marin/web/parquet_preview.py",
        "resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))",
        "pass",
        "tests/marin/test_web_limits.py",
    ),
    (
        "operations/shards.py",
        "    signal.signal(signal.SIGTERM, signal.SIG_DFL)\n",
        "",
        "tests/operations/test_shards.py",
    ),
    (
        "executor/lease.py",
        "    except IsADirectoryError:\n        raise NotRegularFileError(path,",
        "    except IsADirectoryError:\n        return None\n        raise NotRegularFileError(path,",
        "tests/executor/test_status_file_kinds.py",
    ),
    (
        "executor/store.py",
        'if scheme != "memory" and (not rest.strip("/") or rest.startswith("/")):',
        "if False:",
        "tests/executor/test_bad_cli.py",
    ),
    (
        "executor/runner.py",
        "            with _second_ctrl_c_deferred():\n",
        "            with contextlib.nullcontext():\n",
        "tests/executor/test_console_and_signals.py",
    ),
    (
        "executor/runner.py",
        "        links = remove_links_leading_out(self.store, row.output_path)\n",
        "        links = []\n",
        "tests/executor/test_temp_files_after_failure.py",
    ),
    (
        "executor/graph.py",
        "    kind = _not_plain_function(fn)\n",
        "    kind = None\n",
        "tests/executor/test_declaration_checks.py",
    ),
    (
        "marin/web/safety.py",
        "    if repeats is None or repeats > MAX_PATTERN_REPEATS:",
        "    if repeats is None and False:",
        "tests/marin/test_leaderboard.py",
    ),
    (
        "executor/main.py",
        "    _refuse_repeated_flags(argv)\n",
        "",
        "tests/executor/test_bad_cli.py",
    ),
    # Twelfth session.
    (
        "executor/outcomes.py",
        "            emit(skipped_event(row))\n",
        "            pass\n",
        "tests/executor/test_fast_paths.py",
    ),
    (
        "executor/outcomes.py",
        "    if todo:\n        raise ValueError",
        "    if False:\n        raise ValueError",
        "tests/executor/test_fast_paths.py",
    ),
    (
        "executor/executor.py",
        "from executor.outcomes import DEFAULT_MAX_RETRIES",
        "import executor.runner  # noqa: F401\nfrom executor.outcomes import DEFAULT_MAX_RETRIES",
        "tests/executor/test_fast_paths.py",
    ),
    (
        "executor/steps.py",
        "MAX_LAST_NAME_PART = MAX_NAME_PART - 9\n",
        "MAX_LAST_NAME_PART = MAX_NAME_PART - 8\n",
        "tests/executor/test_bad_input.py",
    ),
    (
        "executor/steps.py",
        "    if len(name) > MAX_LAST_NAME_PART and _long_part(name) is not None:",
        "    if False:",
        "tests/executor/test_bad_input.py",
    ),
    (
        "executor/executor.py",
        "        _refuse_manifests_inside_an_output(graph, self.executor_info_base_path)\n",
        "",
        "tests/executor/test_runner.py -k base_path_inside",
    ),
    # Twelfth session: survivors of the mutmut sample, pinned by new in-process tests.
    (
        "executor/main.py",
        '        if not arg.startswith("--") or arg == "--":',
        '        if not arg.startswith("XX--XX") or arg == "--":',
        "tests/executor/test_mutation_guards.py -k twice",
    ),
    (
        "executor/plan.py",
        '    except RecursionError:\n        raise ValueError("nested too deeply") from None',
        "    except RecursionError as error:\n        raise ValueError(str(error)) from None",
        "tests/executor/test_mutation_guards.py -k nested_too",
    ),
    (
        "executor/executor.py",
        '            + (f" {steps.name!r}: pass [step]"',
        '            - (f" {steps.name!r}: pass [step]"',
        "tests/executor/test_mutation_guards.py -k instead_of_a_list",
    ),
    (
        "executor/lease.py",
        'raise NotRegularFileError(path, f"it is over',
        'raise NotRegularFileError(None, f"it is over',
        "tests/executor/test_mutation_guards.py -k too_big",
    ),
    (
        "executor/terminal.py",
        '.replace("\\r", "\\n")',
        '.replace("\\r", "XX\\nXX")',
        "tests/executor/test_mutation_guards.py -k carriage",
    ),
    (
        "executor/store.py",
        'if scheme != "memory" and',
        'if scheme != "MEMORY" and',
        "tests/executor/test_mutation_guards.py -k memory_prefix",
    ),
    (
        "executor/backends/local.py",
        "                    env=child_env(),\n",
        "                    env=None,\n",
        "tests/executor/test_mutants_backends_local.py -k hosted_step_runs_with",
    ),
    (
        "executor/tree.py",
        "    if len(text) > INFO_READ_BY_TOOLS_BYTES:",
        "    if False:",
        "tests/marin/test_untrusted_trees.py -k tools_cannot",
    ),
    # Thirteenth session: cheaper cached re-runs (docs/benchmarks.md).
    (
        "executor/records.py",
        "(f[3] if f[4] is None else f[4])",
        "f[3]",
        "tests/executor/test_records.py -k 'not generated_methods_file'",
    ),
    (
        "executor/records.py",
        'params += ["*", *kw_params]',
        "params += kw_params",
        "tests/executor/test_records.py -k 'not generated_methods_file'",
    ),
    (
        "executor/records.py",
        "if saved and any(params.frozen for params in saved) != frozen:",
        "if False:",
        "tests/executor/test_records.py -k 'not generated_methods_file'",
    ),
    (
        "executor/lazy_logging.py",
        "    import logging\n\n    apply_pending_config()\n",
        "    import logging\n\n",
        "tests/executor/test_lazy_logging.py",
    ),
    (
        "executor/executor.py",
        "                    collector.resume()",
        "                    pass",
        "tests/executor/test_collector.py",
    ),
    (
        "executor/collector.py",
        'os.environ.get(GC_AT_EXIT_ENV) == "1"',
        "False",
        "tests/executor/test_collector.py",
    ),
    (
        "executor/plan.py",
        "listings[parent] = None if exists else store.child_names(parent)",
        "listings[parent] = store.child_names(parent)",
        "tests/executor/test_fast_paths.py",
    ),
    (
        "executor/walker.py",
        "                new = on_marker(old, child, depth)",
        "                new = on_marker(old, name, depth)",
        "tests/executor/test_golden_hashes.py tests/executor/test_versioning.py",
    ),
    (
        "executor/graph.py",
        "    while cut >= shortest and cut > 0:",
        "    while cut > shortest and cut > 0:",
        "tests/executor/test_declaration_checks.py tests/executor/test_bad_input.py",
    ),
    # -- twentieth session: reproduce from a directory outside git --
    (
        "marin/reproduce.py",
        "    checkout, current = commit_checkout(checkout) if commits else (checkout, None)\n",
        '    current = git_state(checkout).get("commit") if commits else None\n',
        "tests/marin/test_cli.py -k outside_git",
    ),
    (
        "marin/reproduce.py",
        '    if state.get("root"):\n        return checkout, state.get("commit")\n',
        "",
        "tests/marin/test_cli.py -k experiment_script",
    ),  # -- twenty-first session: a set endpoint nobody listens on fails in about a second ------------
    *[
        ("executor/retry.py", fix, mutant, "tests/executor/test_endpoint_probe.py")
        for fix, mutant in [
            (
                "        except (ConnectionRefusedError, socket.gaierror) as error:",
                "        except socket.gaierror as error:",
            ),
            (
                "    if not endpoint or any(os.environ.get(name) or os.environ.get(name.lower()) for name in _PROXY_VARIABLES):",
                "    if not endpoint:",
            ),
            ("            return None\n    return refused\n", "            return None\n    return None\n"),
            (
                '    return parts.hostname, port or (443 if parts.scheme == "https" else 80)',
                "    return parts.hostname, port or 80",
            ),
        ]
    ],
    (
        "executor/store.py",
        "        if refused is not None:\n            raise StoreError",
        "        if False:\n            raise StoreError",
        "tests/executor/test_endpoint_probe.py",
    ),
    # -- twenty-second session: a red-team pass over shared trees, interrupts and leases --------
    (
        "marin/gc.py",
        "            if tree.manifest_problems:  # it may be one of theirs",
        "            if False:  # it may be one of theirs",
        "tests/marin/test_hostile_tree_readers.py -k manifest",
    ),
    (
        "marin/outputs.py",
        '                raise TreeFileError(f"{path} is a directory, not a file: not read")',
        "                return None",
        "tests/marin/test_hostile_tree_readers.py -k directory",
    ),
    (
        "marin/outputs.py",
        '            return _moved(path, recorded.rstrip("/"), prefix)',
        "            return path",
        "tests/marin/test_hostile_tree_readers.py -k copied",
    ),
    (
        "marin/outputs.py",
        "        return path if moved is None or not isinstance(path, str) else _moved(path, *moved)",
        "        return path",
        "tests/marin/test_hostile_tree_readers.py -k 'copied_tree or relocated_only'",
    ),
    (
        "executor/runner.py",
        "        refusal = self._guard.refusal(path, absent=row.absent)\n        if refusal is not None:",
        "        refusal = self._guard.refusal(path, absent=row.absent)\n        if False:",
        "tests/executor/test_temp_files_after_failure.py",
    ),
    (
        "executor/runner.py",
        "                if last is not None or (not row.absent and self._found_files(path)):",
        "                if last is not None:",
        "tests/executor/test_temp_files_after_failure.py",
    ),
    (
        "executor/tree.py",
        "        if found is None and not absent and os.path.islink(local):",
        "        if False:",
        "tests/executor/test_temp_files_after_failure.py -k refused",
    ),
    (
        "executor/runner.py",
        "        stop_running_work()\n",
        "",
        "tests/operations/test_shards.py -k interrupted",
    ),
    (
        "executor/lease.py",
        "            return now - seen[1] > self.config.timeout",
        "            return False",
        "tests/marin/test_hostile_tree_readers.py -k bytes_keep_changing",
    ),
    (
        "executor/lease.py",
        "            if seen is None or seen[0] != current:",
        "            if seen is None:",
        "tests/marin/test_hostile_tree_readers.py -k bytes_keep_changing",
    ),
    (
        "executor/tree.py",
        "    except NotADirectoryError:\n        raise _file_in_place_of_directory(os.path.dirname(local)) from None\n",
        "    except NotADirectoryError:\n        return None\n",
        "tests/executor/test_bad_status_files.py -k file_in_place",
    ),
    (
        "executor/runner.py",
        "                if last is not None or (not row.absent and self._found_files(path)):",
        "                if last is not None or self._found_files(path):",
        "tests/executor/test_temp_files_after_failure.py -k first_attempt_lists_nothing",
    ),
    (
        "executor/plan.py",
        '    return PlannedStep(step, Action.RUN, "no output yet", status, absent=absent)',
        '    return PlannedStep(step, Action.RUN, "no output yet", status)',
        "tests/executor/test_temp_files_after_failure.py -k first_attempt_lists_nothing",
    ),
    (
        "executor/resources.py",
        "            _check_plain_request(value)\n",
        "",
        "tests/executor/test_resources.py -k plain_dict",
    ),
    (
        "executor/steps.py",
        '        and "cpu" not in resources\n        and "gpu" not in resources\n',
        "",
        "tests/executor/test_resources.py -k plain_dict",
    ),  # -- twenty-third session --------------------------------------------------------------
    (
        "executor/lease.py",
        "                self.store.delete_between_swaps(path)",
        "                self.store.delete(path)",
        "tests/executor/test_lease_races.py -k young_release",
    ),
    (
        "executor/store.py",
        "        with self._locked(path):\n            self.delete(path)\n",
        "        self.delete(path)\n",
        "tests/executor/test_lease_races.py -k young_release",
    ),
    (
        "executor/main.py",
        "        _exit_if_the_plan_has_errors(plan)",
        "        pass",
        "tests/executor/test_mutation_guards.py -k dry_run",
    ),
    (
        "executor/main.py",
        "    failing = [row.name for row in (plan.rows if plan is not None else ()) if row.action == Action.ERROR]",
        "    failing = [row.name for row in (plan.rows if plan is not None else ()) if row.action == Action.BLOCKED]",
        "tests/executor/test_mutation_guards.py -k dry_run",
    ),
    (
        "executor/provenance.py",
        "        f'{entry},\"outcome\":{encode(outcome_of.get(step.output_path))}}}'",
        "        f'{entry},\"outcome\":null}}'",
        "tests/executor/test_runner.py -k manifest",
    ),
    (
        "marin/predictions.py",
        "            steps = found[0] if fn == TARGET_FN else found[1]",
        "            steps = found[0]",
        "tests/marin/test_predictions.py",
    ),
    (
        "executor/executor.py",
        'ENDING_SIGNALS = ("SIGTERM", "SIGHUP")',
        'ENDING_SIGNALS = ("SIGTERM",)',
        "tests/executor/test_console_and_signals.py -k sighup",
    ),
    (
        "executor/executor.py",
        "        if number is None or signal.getsignal(number) != signal.SIG_DFL:",
        "        if number is None:",
        "tests/executor/test_console_and_signals.py -k nohup",
    ),
    (
        "executor/lease_keeper.py",
        '    for name in ("SIGINT", "SIGTERM", "SIGHUP"):',
        '    for name in ("SIGINT",):',
        "tests/executor/test_console_and_signals.py -k whole_process_group",
    ),
    (
        "executor/runner.py",
        "        if self._stop.is_set():\n            # The run was interrupted: `_interrupt` records the step",
        "        if False:\n            # The run was interrupted: `_interrupt` records the step",
        "tests/executor/test_interrupt_races.py -k work_was_stopped",
    ),
    (
        "operations/shards.py",
        "                ray.wait(refs, num_returns=len(refs), timeout=_TERMINATE_GRACE_SECONDS)",
        "                pass",
        "tests/operations/test_shards_ray.py -k interrupt",
    ),
    (
        "marin/leaderboard.py",
        "    if len(run.version_config) <= MAX_COMPARED_FIELDS:\n        return run.version_config",
        "    if True:\n        return run.version_config",
        "tests/marin/test_web_budgets.py -k compares_at_most",
    ),
    (
        "marin/predictions.py",
        "        if len(text) <= MAX_LABEL_CHARS:\n            return text",
        "        if True:\n            return text",
        "tests/marin/test_predictions.py -k million",
    ),
    (
        "executor/walker.py",
        '            map_markers(item, _refuse_in_set, f"{path}[*]", depth)',
        "            pass",
        "tests/executor/test_declaration_mistakes.py -k inside_a_set",
    ),
    (
        "executor/walker.py",
        "    if obj is this_output_path or obj is output_path_of:",
        "    if False:",
        "tests/executor/test_declaration_mistakes.py -k without_calling",
    ),
    (
        "executor/graph.py",
        "    try:\n        signature.bind(None)\n",
        "    try:\n        signature.bind(None, None) if False else None\n",
        "tests/executor/test_declaration_mistakes.py -k cannot_take_the_config",
    ),
    (
        "executor/steps.py",
        '    if "/../" in wrapped:',
        "    if False:",
        "tests/executor/test_declaration_mistakes.py -k hard_coded",
    ),
    (
        "executor/template.py",
        '        except StepDefinitionError as error:\n            raise TemplateError(f"{_at(path)}: {error}") from None',
        '        except KeyError as error:\n            raise TemplateError(f"{_at(path)}: {error}") from None',
        "tests/executor/test_mutants_template.py -k hardcoded",
    ),
    (
        "executor/executor.py",
        "        if not description_fits(description):",
        "        if False:",
        "tests/executor/test_declaration_mistakes.py -k experiment_description",
    ),
    (
        "operations/train.py",
        "    if not (_is_number(rate) and math.isfinite(rate) and rate >= 0):",
        "    if not _is_number(rate):",
        "tests/operations/test_bad_train_input.py -k bad_settings_fail",
    ),
    (
        "operations/train.py",
        "        if recorded is not None and int(recorded) != vocab_size:",
        "        if recorded is not None and int(recorded) < vocab_size:",
        "tests/operations/test_bad_train_input.py -k tokenizer_smaller",
    ),
]
"""The mutants, in the order they were written (see docs/testing.md for what each fix does)."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a new temporary one)")
    parser.add_argument("--only", default=None, help="run only the mutants of files whose path contains this")
    parser.add_argument("--last", type=int, default=None, help="run only the last N mutants (the newest)")
    args = parser.parse_args()
    newest = MUTANTS[-args.last :] if args.last else MUTANTS
    mutants = [mutant for mutant in newest if args.only is None or args.only in mutant[0]]
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    workdir = args.workdir or tempfile.mkdtemp(prefix="hand-mutants-")
    os.makedirs(workdir, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", repo, "archive", args.commit], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", workdir], input=archive, check=True)
    # A git checkout, as CI's fresh clone is: tests that check recorded commits run there
    # instead of skipping (a skipped test would let its mutant survive).
    git = ["git", "-C", workdir, "-c", "user.name=hand-mutants", "-c", "user.email=hand-mutants@localhost"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "scratch copy"]):
        subprocess.run([*git, *command], check=True, capture_output=True)
    survived = errors = 0
    for path, old, new, tests in mutants:
        target = os.path.join(workdir, path)
        with open(target) as handle:
            original = handle.read()
        if old not in original:  # the code changed since: the mutant must be rewritten (not a kill)
            errors += 1
            print(f"NOT FOUND: {path}: {old[:70]!r}", flush=True)
            continue
        with open(target, "w") as handle:
            handle.write(original.replace(old, new, 1))
        try:
            selection = shlex.split(tests) + ([] if "-k" in tests else ["-k", "not browser"])
            result = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "-x",
                    "-p",
                    "no:randomly",
                    "-p",
                    "no:cacheprovider",
                    *selection,
                ],
                cwd=workdir,
                # Processes the tests start (`python -P -m ...`) import the copy too, not the
                # checkout the editable install points at.
                env={**os.environ, "PYTHONPATH": workdir},
                capture_output=True,
                timeout=900,
            )
        finally:
            with open(target, "w") as handle:
                handle.write(original)
        # pytest's exit codes: 1 tests failed, 2 a collection error (the mutant broke an
        # import): caught. 4 (a bad -k or path) and 5 (no test selected) say nothing about the
        # mutant: they are errors of this list, not kills.
        if result.returncode in (0, 1, 2):
            killed = result.returncode != 0
            survived += not killed
            print(f"{'killed' if killed else 'SURVIVED'}: {path}: {old[:70]!r}", flush=True)
        else:
            errors += 1
            tail = result.stdout.decode(errors="replace").strip().splitlines()[-1:]
            print(f"ERROR (pytest exit {result.returncode}: {tail}): {path}: {old[:70]!r}", flush=True)
    print(f"{len(mutants) - survived - errors} of {len(mutants)} caught (workdir {workdir})")
    return 1 if survived or errors else 0


if __name__ == "__main__":
    sys.exit(main())
