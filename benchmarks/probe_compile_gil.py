"""Does XLA's compilation release Python's GIL? (issue 19: compiling a fit's programs ahead)

Compiles a few small programs of nested Hessians (the shape of a fit's item programs) on a
background thread while the main thread runs a pure-Python loop, and prints the loop's
speed against its speed alone. Near 1.0 (on two or more cores): compilation runs beside
Python, and compiling programs ahead on threads would overlap with tracing. Near 0.3:
it holds the GIL most of the time, and it would not.

    python benchmarks/probe_compile_gil.py
"""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp


def _program(i: int):
    def f(x, y):
        def g(v):
            return jnp.sum(jnp.tanh(jnp.outer(v, y)) ** (i % 3 + 1)) + jnp.sum(jnp.sin(v * i))

        inner = jax.vmap(jax.hessian(g))(jnp.stack([x] * 3)).sum()
        return inner + jnp.linalg.slogdet(jax.hessian(lambda v: jax.hessian(g)(v).sum())(x))[1]

    return jax.jit(f)


def _spin(seconds: float) -> int:
    start, count = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        count += 1
    return count


def main() -> None:
    jax.config.update("jax_enable_compilation_cache", False)
    specs = (jax.ShapeDtypeStruct((8,), jnp.float32), jax.ShapeDtypeStruct((5,), jnp.float32))
    lowered = [_program(i).lower(*specs) for i in range(6)]
    alone = _spin(1.0)
    start = time.perf_counter()
    for low in lowered[:3]:
        low.compile()
    serial = time.perf_counter() - start
    worker = threading.Thread(target=lambda: [low.compile() for low in lowered[3:]])
    start, count = time.perf_counter(), 0
    worker.start()
    while worker.is_alive():
        count += 1
    beside = time.perf_counter() - start
    print(f"jax {jax.__version__}: 3 programs compiled in {serial:.2f} s on the main thread, "
          f"3 more in {beside:.2f} s on a background thread; the main thread's Python loop "
          f"ran meanwhile at {count / beside / alone:.2f} of its speed alone")


if __name__ == "__main__":
    main()
