"""The image's ``USER`` for a sandbox's shell sessions: the argv that switches to it.

Owns :func:`as_user`. Docker runs a container's commands as the image config's ``USER``
(``name``, ``uid``, ``name:group`` or ``uid:gid``) with the passwd entry's ``HOME``; the switch
here is done inside the sandbox (ids 0-65535 are mapped, ``userns_full_range``) by a small
``/bin/sh`` script that reads the image's own ``/etc/passwd`` and ``/etc/group`` and ends in
``setpriv`` (util-linux, as the runtime's shell path already needs). Invariants:

- root (``None``, ``""``, ``root``, ``0``, ``0:0``, ``root:root``) means no switch at all;
- a name the image's ``/etc/passwd`` does not have fails the command (exit 126), it never runs
  as root; a numeric uid without an entry runs as that uid, gid 0 unless given, ``HOME=/``
  (Docker's behaviour);
- supplementary groups are the user's from ``/etc/group`` (``--init-groups``), none when a
  group is named or the uid has no entry.
"""

from __future__ import annotations

from collections.abc import Sequence

ROOT_USERS = frozenset({"", "root", "0", "0:0", "root:root", "root:0", "0:root"})

# $1: the USER string; the rest: the command. Looks up passwd/group itself (no getent: minimal
# images lack it), then exec setpriv with the entry's HOME/USER/LOGNAME.
_SWITCH = r"""
want=$1; shift
u=${want%%:*}; g=
case $want in *:*) g=${want#*:};; esac
name= uid= gid= home=/
while IFS=: read -r n _ i j _ h _; do
  if [ "$n" = "$u" ] || [ "$i" = "$u" ]; then name=$n uid=$i gid=$j home=$h; break; fi
done < /etc/passwd
if [ -z "$uid" ]; then
  case $u in
    ''|*[!0-9]*) echo "rollbank: the image's USER $u is not in /etc/passwd" >&2; exit 126;;
  esac
  uid=$u gid=0 name=$u
fi
groups=--init-groups
if [ -n "$g" ]; then
  gid=
  while IFS=: read -r n _ i _; do
    if [ "$n" = "$g" ] || [ "$i" = "$g" ]; then gid=$i; break; fi
  done < /etc/group
  if [ -z "$gid" ]; then
    case $g in
      *[!0-9]*) echo "rollbank: the image's USER group $g is not in /etc/group" >&2; exit 126;;
    esac
    gid=$g
  fi
  groups=--clear-groups
fi
[ "$name" = "$uid" ] && groups=--clear-groups
export HOME="$home" USER="$name" LOGNAME="$name"
exec setpriv --reuid="$uid" --regid="$gid" "$groups" -- "$@"
"""


def is_root(user: str | None) -> bool:
    return user is None or user.strip() in ROOT_USERS


def as_user(user: str | None, argv: Sequence[str]) -> list[str]:
    """``argv`` run as the image's ``user`` inside the sandbox (unchanged for root)."""
    if is_root(user):
        return list(argv)
    assert user is not None
    return ["/bin/sh", "-c", _SWITCH, "sh", user.strip(), *argv]
