"""Text environments for the multi-turn GRPO tests (``distrl train grpo distrl_textenvs:NAME --model DIR``)."""

DIGITS = ("0", "1", "2")


class HiddenDigit:
    """A hidden digit in {0, 1, 2}, the same for a group (drawn from the row's seed). The model guesses one digit
    a turn and is told '<' (the digit is lower), '>' (higher) or nothing more: the episode ends, with reward 1,
    when the guess is right; a guess that is not a digit, or the last wrong one, ends it with 0. Without the
    answers the best a policy can do is two different digits: 2/3 of the time right; with them, always right
    in two guesses (1 first, then what the answer points to)."""

    def __init__(self, guesses=2):
        self.guesses = guesses

    def reset(self, row):
        self.secret, self.turns = DIGITS[row["seed"] % 3], 0
        return "="

    def step(self, model_turn):
        self.turns += 1
        if model_turn == self.secret:
            return "", 1.0, True, False, {}
        if model_turn not in DIGITS or self.turns >= self.guesses:
            return "", 0.0, True, False, {}
        return ("<" if self.secret < model_turn else ">"), 0.0, False, False, {}


def hidden_digit(guesses=2):
    return HiddenDigit(guesses)


class Talker:
    """Never ends by itself; answers each turn with 1 to 3 characters that depend on the turn, records the turns it
    was given, and rewards each turn with its length (so the return is the model's text length)."""

    made = []

    def __init__(self, answer="<>"):
        self.answer = answer
        self.heard = []
        self.row = None
        Talker.made.append(self)

    def reset(self, row):
        self.row = row
        return "1" * (1 + row["seed"] % 3) + "="

    def step(self, model_turn):
        self.heard.append(model_turn)
        return self.answer[: 1 + len(model_turn) % len(self.answer)] or "=", float(len(model_turn)), False, False, {}


def talker(answer="<>"):
    return Talker(answer)


class Chatty:
    """Answers in chat messages: a user message saying how many characters the turn had."""

    def reset(self, row):
        return [{"role": "user", "content": "12="}]

    def step(self, model_turn):
        return [{"role": "user", "content": str(len(model_turn))}], 0.0, False, False, {}


def chatty():
    return Chatty()


def transcript_length(prompts, completions, **fields):
    """The transcript's length in characters."""
    return [float(len(c)) for c in completions]


not_callable = 3


class OnlyReset:
    def reset(self, row):
        return "1"


def no_step():
    return OnlyReset()


class WrongStep:
    def reset(self, row):
        return "1"

    def step(self, model_turn):
        return "1", 0.0


def wrong_step():
    return WrongStep()
