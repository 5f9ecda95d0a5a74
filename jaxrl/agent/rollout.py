"""Multi-turn rollouts: drive a batch of agent episodes turn by turn with any engine.

Each turn, every episode still running sends its conversation so far to the
engine in one call (one completion each), its env applies the reply's tool call,
and the observation extends the conversation. Token engines get the
concatenated row of `jaxrl.agent.tokens` as the next prompt (exactly what the
trainer recomputes); `chat` engines (`openai --api chat`) get the messages, the
assistant turns as their answers, and the server renders them.

Every turn has the same sampling parameters (a per-turn thinking budget and
token budget); turn t of a batch samples with a seed drawn from the run's seed,
the batch's first episode and t.

On several hosts an engine call is a collective (the `jax` engine): every host calls the
engine each turn, with no prompts once its own episodes have ended, until every host's have.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from jaxrl import hosts, prompts
from jaxrl.agent.env import DEFAULT_TURNS, AgentEnv, TestRunner
from jaxrl.agent.episode import Episode, Turn
from jaxrl.agent.tokens import Segment, context_ids, observation_text
from jaxrl.eval.evaluate import Request, batch_seed
from jaxrl.eval.protocol import THINK_OPEN, response_text
from jaxrl.rollout.engine import Completion, Engine, SamplingParams
from reward.schema import Task

# Requests -> one list of completions per request (`params.n` each), in order.
Sampler = Callable[[Sequence[Request], SamplingParams], list[list[Completion]]]


@dataclasses.dataclass(frozen=True)
class AgentRollout:
    """One finished episode, and its token segments (None when sampled through chat messages)."""

    episode: Episode
    segments: tuple[Segment, ...] | None


def engine_sampler(engine: Engine, chat: bool = False) -> Sampler:
    """A `Sampler` over an engine: its chat completions with `chat`, else its token-id generation."""
    if chat:
        return lambda requests, params: engine.chat([r.messages for r in requests], params)
    return lambda requests, params: engine.generate([r.prompt_ids for r in requests], params)


class _Running:
    """One episode in flight: its env, conversation, token segments and turns so far."""

    def __init__(self, task: Task, sample: int, tokenizer, turns: int, enable_thinking: bool, chat: bool,
                 run_tests: TestRunner | None, prompt: str):
        self.task, self.sample, self.tokenizer = task, sample, tokenizer
        self.enable_thinking, self.chat = enable_thinking, chat
        self.env = AgentEnv(task.buggy_code, turns, run_tests, prompt)
        self.messages = prompts.agent_messages(task.prompt, task.buggy_code, run_tests is not None, prompt)
        text = tokenizer.render_chat(self.messages, enable_thinking=enable_thinking)
        self.think_opened = not chat and enable_thinking and text.endswith(THINK_OPEN)
        self.segments = [Segment(tuple(tokenizer.encode(text)))]
        self.turns: list[Turn] = []
        self.out_of_room = False

    def request(self) -> Request:
        return Request(self.task, list(self.messages), [] if self.chat else context_ids(self.segments),
                       self.think_opened)

    def take(self, c: Completion) -> None:
        step = self.env.step(c.answer)
        self.turns.append(Turn(response_text(c), c.thinking, c.answer, step.call.to_json() if step.call else None,
                               step.observation, self.env.file, step.valid, step.edit_failed, c.finish_reason,
                               len(c.token_ids), c.budget_hit))
        if self.chat:
            self.messages += [{"role": "assistant", "content": c.answer}, {"role": "user", "content": step.observation}]
            return
        self.segments.append(Segment(tuple(c.token_ids), tuple(c.logprobs), True, tuple(c.forced)))
        if not step.done:
            closed = bool(c.token_ids) and c.token_ids[-1] == self.tokenizer.im_end_id
            text = observation_text(step.observation, closed, self.tokenizer, self.enable_thinking)
            self.segments.append(Segment(tuple(self.tokenizer.encode(text))))

    def result(self) -> AgentRollout:
        ended = "submit" if self.env.submitted else "context" if self.out_of_room else "turns"
        episode = Episode(self.task.task_id, self.sample, tuple(self.turns), ended, self.env.file)
        return AgentRollout(episode, None if self.chat else tuple(self.segments))


def run_episodes(sampler: Sampler, tokenizer, starts: Sequence[tuple[Task, int]], params: SamplingParams, *,
                 turns: int = DEFAULT_TURNS, enable_thinking: bool = True, chat: bool = False,
                 test_runner: Callable[[Task], TestRunner] | None = None,
                 max_context: int | None = None, prompt: str = "agent") -> list[AgentRollout]:
    """Run one episode per (task, sample index) to its end, all turns batched; rollouts in input order.

    Args:
        sampler: the engine behind one call per turn (`engine_sampler`, or one with retries).
        tokenizer: renders and encodes the conversation (`models.tokenizer.QwenTokenizer`).
        starts: (task, sample index) of each episode.
        params: sampling of every turn (`n` is ignored: one completion per episode and turn).
        turns: the turn budget.
        enable_thinking: render the chat with thinking on.
        chat: send messages (`engine.chat`) instead of token ids.
        test_runner: the task -> its `run_tests` tool; None leaves the tool off.
        max_context: token episodes only: an episode whose context plus `params.max_tokens` exceeds
            this ends before the turn (`ended_by` "context"), so every row fits `max_context` tokens.
        prompt: the agent prompt (`jaxrl.prompts.AGENT_PROMPTS`): first messages and retry message.
    """
    running = [_Running(task, k, tokenizer, turns, enable_thinking, chat,
                        test_runner(task) if test_runner else None, prompt) for task, k in starts]
    for t in range(turns):
        if max_context is not None and not chat:
            for r in running:
                if not r.env.done and sum(len(s.token_ids) for s in r.segments) + params.max_tokens > max_context:
                    r.out_of_room = True
        active = [r for r in running if not r.env.done and not r.out_of_room]
        if not any(hosts.gather_json(bool(active))):
            break
        first = f"{active[0].task.task_id}#{active[0].sample}" if active else ""
        seed = batch_seed(params.seed, f"{first}#turn{t}")
        out = sampler([r.request() for r in active], dataclasses.replace(params, n=1, seed=seed))
        if len(out) != len(active) or any(len(group) != 1 for group in out):
            raise RuntimeError(f"the engine returned {[len(g) for g in out]} completions "
                               f"for {len(active)} prompts × 1")
        for r, (c,) in zip(active, out):
            r.take(c)
    return [r.result() for r in running]
