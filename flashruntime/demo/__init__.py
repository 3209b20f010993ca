"""The bundled demo: a small training script run through ``flash.submit`` with an
injected crash, so ``flashruntime demo`` shows classification, recovery and resume
on a machine with nothing but the core installed."""
