"""The phases' Prefect tasks: a phase (`phase`), its experiment attempts (`attempts`), the
engine's own steps (`reproduction`, `sealed_scoring`, `report_header`) and where the engine's
tasks run (`execution`). What a phase is, and its rules, is the registry's
(`labrun.phase_registry`)."""
