"""``python -m ferry.worker``: a ferry worker in this interpreter.

A loader started from Python starts its local workers this way (one
process each, like ``ferry-worker``): the C worker loop runs here and
serves every dataset kind, ``python:`` ones included. As a remote worker::

    python -m ferry.worker --connect tcp://HOST:PORT --key worker.key \\
        --server-key loader.pub --allow-module mypkg [--processes N]

serves Python datasets only from modules under the ``--allow-module``
prefixes (repeat it, or give a comma list): a loader cannot make it import
and call anything else. The other options are ferry-worker's.
"""

import sys

from . import _dataset, _ferry

_NAME = "python -m ferry.worker"


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    allow, rest = [], []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--allow-module" or a.startswith("--allow-module="):
            if "=" in a:
                value = a.split("=", 1)[1]
            elif i + 1 < len(argv):
                i += 1
                value = argv[i]
            else:
                print("%s: --allow-module needs a module prefix" % _NAME, file=sys.stderr)
                return 2
            allow += [p.strip() for p in value.split(",") if p.strip()]
        else:
            rest.append(a)
        i += 1
    if "--help" in rest or "-h" in rest:
        _ferry.worker_main([_NAME, "--help"], [], _NAME)
        print("python workers:\n"
              "  --allow-module PFX  (remote) serve python: datasets from modules under PFX\n"
              "                      only; repeat or use commas. Without it, none at all")
        return 0
    remote = "--slot" not in rest
    _dataset.configure(remote=remote, allow=allow)
    relaunch = [sys.executable, "-m", "ferry.worker"]
    for p in allow:
        relaunch += ["--allow-module", p]
    sys.stdout.flush()
    return _ferry.worker_main([_NAME] + rest, relaunch, _NAME)


if __name__ == "__main__":
    sys.exit(main())
