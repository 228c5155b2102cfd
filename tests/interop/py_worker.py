"""One interop Python for a whole end-to-end test (tests/e2e/lib/common.bash's require_interop_python starts it).

Importing torch and transformers takes 2-4 s, more than most of the checks an interop test runs with them, and a
test runs up to ten of them. This worker imports the modules once and then runs each request as `python` would:
`SCRIPT ARGS...`, `-c CODE ARGS...` or `- ARGS...` (the code given as a file), with sys.argv, sys.path[0], the
working directory and the environment of the request, its stdout and stderr (file descriptors 1 and 2, so
subprocesses and C libraries write there too) sent to the request's files, and the exit status python would give
(SystemExit's code; 1 and a traceback for an uncaught exception).

Usage: py_worker.py REQUEST_FIFO REPLY_FIFO MODULE...
A request is one line: the path of a JSON file {"cwd", "argv", "env", "code_file", "out", "err"}; the reply is one
line with the exit status. The worker ends at the end of REQUEST_FIFO (the test's shell has exited).
"""

import importlib
import json
import os
import runpy
import sys
import traceback


def run(request):
    argv, cwd = request["argv"], request["cwd"]
    saved_env, saved_path, saved_cwd = dict(os.environ), list(sys.path), os.getcwd()
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(cwd)
    sys.stdout.flush()
    sys.stderr.flush()
    saved_fds = os.dup(1), os.dup(2)
    out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.close(out)
    os.close(err)
    status = 0
    try:
        if argv[0] in ("-c", "-"):
            code = argv[1] if argv[0] == "-c" else open(request["code_file"]).read()
            sys.argv = [argv[0]] + argv[2 if argv[0] == "-c" else 1:]
            sys.path[0] = ""
            exec(compile(code, "<string>" if argv[0] == "-c" else "<stdin>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            status = 0
        elif isinstance(e.code, int):
            status = int(e.code)
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException:  # noqa: BLE001 - as python itself: a traceback and status 1
        traceback.print_exc()
        status = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        os.close(saved_fds[0])
        os.close(saved_fds[1])
        sys.path[:] = saved_path
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return status


def main():
    request_fifo, reply_fifo, modules = sys.argv[1], sys.argv[2], sys.argv[3:]
    with open(reply_fifo, "w") as reply:
        for name in modules:
            try:
                importlib.import_module(name)
            except BaseException as e:  # noqa: BLE001 - reported to the test, which fails naming the module
                reply.write(f"cannot import {name}: {type(e).__name__}: {e}".replace("\n", " ") + "\n")
                reply.flush()
                return
        reply.write("ready\n")
        reply.flush()
        with open(request_fifo) as requests:
            for line in requests:
                with open(line.strip()) as f:
                    status = run(json.load(f))
                reply.write(f"{status}\n")
                reply.flush()


if __name__ == "__main__":
    main()
