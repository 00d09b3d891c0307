"""The parts of scripts/study/study.py: the study file (spec), the machine (machine), running the
variants (launch), reading their metrics (runs), statistics (stats), the verdict and the
expectations (verdict), the report (report) and its plots (plots). docs/studies.md describes
the study file."""
