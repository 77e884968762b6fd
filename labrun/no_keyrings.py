"""Run a program with the kernel's keyrings out of its reach: a seccomp filter (classic BPF,
installed with prctl) makes `keyctl`, `add_key` and `request_key` fail with EPERM, then the
program is executed. Why: a session keyring is inherited into the sandbox, and keyrings hold
the user's Kerberos tickets and tools' tokens; no PID, mount or network namespace hides them.
On x86_64 the 32-bit and x32 system calls, whose numbers differ, are refused whole (ENOSYS).

`python -I -c <this text> PROGRAM ARGS...`: the standard library only, run from its text
inside the sandbox like labrun's other helpers (`labrun.sandbox.watched`).
"""

import ctypes
import os
import platform
import struct
import sys

CALLS = {"x86_64": (0xC000003E, (248, 249, 250)), "aarch64": (0xC00000B7, (217, 218, 219))}
"""Machine → its audit architecture and its numbers of add_key, request_key, keyctl."""
ALLOW, DENY, FOREIGN = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38  # SECCOMP_RET_ALLOW, ERRNO(EPERM), ERRNO(ENOSYS)


def program(arch: int, calls: tuple[int, int, int]) -> list[tuple[int, int, int, int]]:
    """(code, jump if true, jump if false, k) for each instruction: load the architecture,
    refuse another; load the call's number, refuse x32's and the three keyring calls."""
    load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    add_key, request_key, keyctl = calls
    return [(load, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, FOREIGN), (load, 0, 0, 0),
            (jge, 3, 0, 0x40000000), (jeq, 2, 0, add_key), (jeq, 1, 0, request_key), (jeq, 0, 1, keyctl),
            (ret, 0, 0, DENY), (ret, 0, 0, ALLOW)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install() -> None:
    machine = CALLS.get(platform.machine())
    if machine is None:
        return  # no numbers known here: the program runs as bubblewrap left it
    code = b"".join(struct.pack("HBBI", *i) for i in program(*machine))
    buffer = ctypes.create_string_buffer(code, len(code))
    prog = SockFprog(len(code) // 8, ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) or libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER,
                                                                  ctypes.byref(prog), 0, 0):
        sys.exit(f"labrun sandbox: cannot keep the keyrings out of reach ({os.strerror(ctypes.get_errno())})")


if __name__ == "__main__":
    install()
    os.execvp(sys.argv[1], sys.argv[1:])
