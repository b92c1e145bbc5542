"""The fine-tuning tasks by --task name. Add a line to `TASKS` to add a task."""

from __future__ import annotations

from bertjax.finetune.tasks.base import Encoded, Labels, Task
from bertjax.finetune.tasks.classification import SequenceClassification
from bertjax.finetune.tasks.multiple_choice import MultipleChoice
from bertjax.finetune.tasks.question_answering import QuestionAnswering
from bertjax.finetune.tasks.token_classification import TokenClassification

TASKS: dict[str, type[Task]] = {task.name: task for task in (SequenceClassification, TokenClassification,
                                                             QuestionAnswering, MultipleChoice)}


def task_class(name: str) -> type[Task]:
    if name not in TASKS:
        raise ValueError(f"--task: unknown task {name!r}; known: {', '.join(TASKS)}")
    return TASKS[name]


def task_for_head(head: str) -> type[Task]:
    """The task of a fine-tuned model class (`bertjax predict` reads it from the model)."""
    for task in TASKS.values():
        if task.head == head:
            return task
    raise ValueError(f"a {head!r} model is not a fine-tuned task model; known heads: "
                     f"{', '.join(t.head for t in TASKS.values())}")


__all__ = ["TASKS", "Task", "Encoded", "Labels", "task_class", "task_for_head"]
