"""What ferry.torch says once per process: a change of code path that a
user must see (a notice) or an argument that means nothing here (a
warning). The keys said are kept in `_warned` (a test clears one to hear
its message again). Called in the trainer, from any module of the
package."""

import logging
import warnings

_warned = set()


def _notice_once(key, text):
    """Says text once per process at the ferry logger's warning level: a
    change of code path a user must see without configuring logging (with
    no handler set up, Python's logging prints warnings on stderr), though
    it is not a fault."""
    if key not in _warned:
        _warned.add(key)
        logging.getLogger("ferry").warning("ferry.torch.DataLoader: %s", text)


def _warn_once(key, text):
    if key not in _warned:
        _warned.add(key)
        warnings.warn("ferry.torch.DataLoader: " + text, stacklevel=3)
