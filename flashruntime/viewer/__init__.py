"""The live run page (SPEC §11). ``page.TOKENS`` is the colour palette it shares with
the coordinator dashboard."""
