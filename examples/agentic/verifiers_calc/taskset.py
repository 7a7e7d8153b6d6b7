"""The tasks (a JSONL file of {prompt, answer}) and the rubric: the boxed answer, and whether the model used
the calculator."""

import json
import re
from pathlib import Path

import verifiers.v1 as vf

from verifiers_calc.tools import CalcToolset

DATA = Path(__file__).resolve().parents[1] / "data" / "calculator_train.jsonl"
_BOXED = re.compile(r"\\boxed\{([^}]*)\}")


class CalcData(vf.TaskData):
    answer: str
    demo: list[str] = []  # a worked episode's assistant messages (a calculator call, then the boxed answer)


class CalcTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class CalcTask(vf.Task[CalcData, vf.State, CalcTaskConfig]):
    @classmethod
    def toolsets(cls, config: CalcTaskConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        found = _BOXED.findall(trace.last_reply or "")
        return float(bool(found) and found[-1].strip() == self.data.answer)

    @vf.reward(weight=0.25)
    async def used_calculator(self, trace: vf.Trace) -> float:
        return float(any(m.name == "calculator" for m in trace.tool_messages))


class CalcConfig(vf.TasksetConfig):
    data_file: str = str(DATA)  # JSONL rows with "prompt" and "answer"
    limit: int = 0  # the first `limit` rows; 0: all
    task: CalcTaskConfig = CalcTaskConfig()


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    def load(self):
        with open(self.config.data_file) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        for row in rows[: self.config.limit or None]:
            yield CalcTask(CalcData(prompt=row["prompt"], answer=row["answer"], demo=row.get("demo", [])),
                           self.config.task)
