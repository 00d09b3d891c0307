#!/bin/sh
# scripts/study/study.py's slurm launcher: it writes an sbatch script per run and a driver; the driver,
# run here with stand-ins for sbatch and srun (the job at once, mpirun for srun), leaves the
# metrics files that --collect turns into the report. Before the jobs run, --collect fails and
# names the runs it lacks.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/study_lib.sh"
make_corpus
study write "$SRC/configs/studies/cpu_dp2_vs_tp2.yaml" --launcher slurm --out "$WORK/sl"
expect_rc "the slurm launcher writes the jobs" 0 write
for v in dp2 tp2; do
  expect_text "$v's job asks for its 2 tasks" '^#SBATCH --ntasks=2$' "$WORK/sl/slurm/$v.sbatch"
  expect_text "$v's job runs the trainer under srun" "^srun .*/trainer configs/tiny.yaml .* log.metrics=$WORK/sl/$v.jsonl" "$WORK/sl/slurm/$v.sbatch"
done
collect early "$WORK/sl" --no-plots
expect_rc "--collect before the jobs ran" 1 early
expect_text "it names the run it lacks" "FAIL: dp2: not run: no log, metrics or status" "$WORK/early.txt"
mkdir "$WORK/bin"
cat > "$WORK/bin/sbatch" <<'SH'
#!/bin/sh
# Runs the job at once, with the task count of its header; prints a job id as sbatch --parsable.
for a; do script=$a; done
SLURM_NTASKS=$(sed -n 's/^#SBATCH --ntasks=//p' "$script") bash "$script" > /dev/null 2>&1
echo "$$;testcluster"
SH
cat > "$WORK/bin/srun" <<SH
#!/bin/sh
exec $MPIRUN -np "\$SLURM_NTASKS" "\$@"
SH
chmod +x "$WORK/bin/sbatch" "$WORK/bin/srun"
if PATH="$WORK/bin:$PATH" bash "$WORK/sl/submit.sh" > "$WORK/submit.txt" 2>&1; then pass "the driver submits both jobs"; else
  fail "the driver: $(cat "$WORK/submit.txt")"; fi
collect done "$WORK/sl"
expect_rc "--collect after the jobs" 0 done
expect_text "the compare passes from the jobs' metrics" '^- tp2 [0-9.]+ x dp2 .*loss curves agree' "$WORK/sl/report.md"
[ -f "$WORK/sl/loss.png" ] && pass "plots from --collect" || fail "no plots from --collect"
summary
