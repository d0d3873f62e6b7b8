"""Write a synthetic multi-turn chat corpus for benchmarking ``packcli pack`` (JSON lines, ``messages``).

Each line is ``{"messages": [{"role": ..., "content": ...}, ...]}``: an optional system turn, then 1 to
12 user/assistant exchanges ending on an assistant turn. A conversation's size is drawn from a lognormal
distribution (by default a median of about 1.5k tokens under a 128k byte-level BPE, with a tail past 8k)
and spread over its turns, the assistant turns taking most of it.

The text is built from a word list with a small grammar: sentences with punctuation, numbers, dates,
versions and quantities; markdown lists and headings; code blocks in several languages; and some
non-ASCII (accented names, typographic punctuation, passages in other scripts, emoji).

The output depends only on ``--seed`` and the options: conversation ``i`` is drawn from its own
generator seeded by (seed, i), so the first N conversations are the same whatever ``--conversations``.
Only the standard library is used.

    python benchmarks/make_chat_corpus.py --conversations 17500 --seed 0 -o benchmarks/data/chat.jsonl
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import math
import random
import sys
import time
from pathlib import Path

# Characters of budget per token: turns a conversation's token budget into a character budget. The
# text of this generator has about 4.4 characters per token under a 128k byte-level BPE; turns overshoot
# their budget by part of a block, so the budget is a little lower. Calibrated on 2,000 conversations with
# packcli's default tokenizer and template so that the median conversation has --median-tokens tokens.
CHARS_PER_TOKEN = 4.1


def _words(text: str) -> list[str]:
    """Split a word list; an underscore stands for a space inside one entry."""
    return [w.replace("_", " ") for w in text.split()]


# -- the word list: parts of speech, roughly by frequency (earlier words are drawn more often) ----------

SINGULAR_DETERMINERS = _words("the the the a a this that each every another one no any")
PLURAL_DETERMINERS = _words("the the the these those some many several all both most no any")
PRONOUNS = _words("it we you they I he she this that someone everyone nobody one")
PREPOSITIONS = _words(
    "of in to for with on at by from into about over after under between through during without within "
    "against across behind beyond toward around before since per via among upon beside like near"
)
CONJUNCTIONS = _words("and but so because while although since unless whereas whenever if once though")
ADVERBS = _words(
    "also only just then still even often usually simply quickly really already almost actually probably "
    "clearly directly easily especially exactly finally generally instead mostly nearly rather slightly "
    "typically carefully roughly explicitly automatically eventually gradually immediately independently "
    "manually naturally partially previously properly rarely regularly significantly strictly together "
    "correctly currently frequently effectively efficiently consistently entirely essentially largely "
    "primarily reliably safely separately sometimes temporarily "
    "accordingly additionally alike allegedly anyway apparently arguably badly barely briefly broadly "
    "casually cheaply closely commonly comparatively completely conveniently critically deeply "
    "deliberately densely desperately differently distinctly dramatically eagerly elsewhere endlessly "
    "equally evenly evidently exclusively extremely fairly firmly fortunately freely fully genuinely "
    "greatly happily heavily hence honestly hopefully ideally importantly incrementally increasingly "
    "indeed inevitably initially intentionally internally lazily lightly literally locally loosely "
    "loudly luckily merely moderately moreover mutually namely neatly necessarily nevertheless newly "
    "nonetheless normally notably noticeably obviously occasionally officially openly originally "
    "otherwise overly patiently perfectly periodically permanently personally physically plainly "
    "politely poorly positively possibly potentially precisely presumably promptly purely quietly "
    "randomly readily reasonably recently relatively remarkably repeatedly respectively sadly "
    "seemingly seriously sharply silently similarly sincerely smoothly softly solely specifically "
    "steadily strongly subsequently substantially successfully suddenly sufficiently surely "
    "surprisingly swiftly systematically technically terribly thereby thoroughly thus tightly "
    "traditionally truly ultimately unexpectedly uniformly unfortunately universally upward urgently "
    "vaguely visibly warmly weekly widely wildly wisely"
)
ADJECTIVES = _words(
    "new good first last long great little own other old right big high different small large next early "
    "important few public bad same able simple common final main full local similar recent specific "
    "current single free clear available easy hard real general open possible better best whole strong "
    "short likely special useful certain major personal private wrong low total basic key natural physical "
    "ready standard correct empty fast slow heavy light dark safe typical modern global internal external "
    "optional required default previous original entire actual direct linear binary remote static dynamic "
    "valid invalid unique random stable legacy complex precise robust efficient narrow broad shallow deep "
    "sparse dense noisy clean raw careful obvious subtle minor primary secondary sudden gradual explicit "
    "implicit abstract concrete visible hidden manual automatic parallel serial relative absolute average "
    "maximum minimum initial temporary permanent formal informal rough smooth quiet loud warm cold fresh "
    "ancient rural urban coastal northern southern eastern western medical legal financial economic social "
    "political historical cultural scientific technical practical theoretical statistical numerical logical "
    "digital mobile wireless neural synthetic organic chemical electrical mechanical thermal acoustic "
    "optical magnetic solar nuclear environmental agricultural industrial commercial residential "
    "abundant academic accessible accurate active adaptive adequate adjacent advanced aggressive agile "
    "alternative ambiguous ambitious ample analog anonymous apparent appropriate approximate arbitrary "
    "asynchronous atomic attractive authentic autonomous aware balanced beautiful beneficial bizarre "
    "blank bold brief brilliant brittle busy calm capable cautious central charming cheap chronic circular "
    "civil classic clever coherent collective colorful comfortable comparable compatible competent "
    "competitive comprehensive compressed confident confidential conservative considerable consistent "
    "constant contemporary continuous convenient conventional corrupt costly creative critical crucial "
    "curious customary decent decisive dedicated defensive definite deliberate delicate dependent "
    "deterministic diverse domestic dominant dramatic durable eager elaborate elegant eligible emotional "
    "empirical endless enormous equivalent essential eternal ethical evident exact excessive exclusive "
    "exotic expensive experimental extensive faint faithful familiar famous fancy fatal favorable "
    "feasible fierce flexible fluent foreign fragile frequent friendly functional fundamental generous "
    "genuine gentle genetic graceful grateful grim handy harmful harmless healthy helpful hollow honest "
    "horizontal hostile huge humble hybrid ideal identical idle immediate immense immutable imperfect "
    "impressive inadequate incomplete incremental independent indirect inevitable influential "
    "innovative insecure intense interactive interested intermediate intuitive irregular isolated "
    "lazy lean legitimate lexical liberal literal lively logical loose loyal magnificent mandatory "
    "marginal massive mature meaningful mild minimal misleading moderate modest modular monthly mutable "
    "mutual naive negative nervous neutral nominal normal notable novel obscure occasional odd offline "
    "online opaque optimal orderly ordinary outdated overall overdue painful paranoid partial passive "
    "peculiar perfect periodic persistent pleasant plain plausible polite popular portable positive "
    "potential powerful predictable preliminary premature prominent prompt proper proprietary "
    "prospective proud provisional punctual pure rapid rare rational readable reasonable redundant "
    "regional regular relevant reliable reluctant remarkable repetitive resilient respectful "
    "responsible restrictive reusable reversible rigid ripe rude sacred satisfied scalable scarce "
    "seamless secure selective sensible sensitive sequential serious severe sharp silent silly sincere "
    "skeptical sleek slim sluggish smart sole solid sophisticated spacious spare spontaneous steady "
    "steep sticky straightforward strange strategic strict structural stubborn subsequent substantial "
    "successful sufficient suitable superior supportive suspicious sustainable swift symbolic "
    "tangible tedious temporal tender thick thin thorough tight tiny tolerant transparent tremendous "
    "trivial tropical ugly ultimate unaware uncertain unclear unexpected unfair uniform unknown "
    "unlikely unnecessary unstable unusual upset urgent usable vague variable vast verbose vertical "
    "vibrant vigorous violent virtual vital volatile vulnerable weekly weird wise wooden worthy yearly "
    "young zealous"
)
NOUNS = _words(
    "time way year people day man thing woman life child world school state family student group country "
    "problem hand part place case week company system program question work government number night point "
    "home water room mother area money story fact month lot right study book eye job word business issue "
    "side kind head house service friend father power hour game line end member law car city community name "
    "president team minute idea kid body information back parent face others level office door health "
    "person art war history party result change morning reason research girl guy moment air teacher force "
    "education foot boy age policy process music market sense nation plan college interest death experience "
    "effect use class control care field development role effort rate heart drug show leader light voice "
    "wife police mind price report decision son view relationship town road arm difference value building "
    "action model season society tax director position player record paper space ground form event "
    "official matter center couple site project activity star table need court oil situation cost industry "
    "figure street image phone data picture practice piece land product doctor wall patient worker news test "
    "movie north love support technology step baby computer type attention film tree source organization "
    "hair window evidence population site bed scene method function variable parameter dataset tokenizer "
    "template sequence token batch model layer weight gradient loss metric server client request response "
    "database query index table column row schema file directory path config option flag error warning "
    "exception message queue thread process memory cache buffer stream packet network protocol address port "
    "library package module version release build test suite benchmark profile trace log label mask vector "
    "matrix tensor array list dictionary string integer float pointer reference object instance interface "
    "framework pipeline workflow deployment container cluster node edge graph tree branch commit merge patch "
    "kernel driver device sensor signal frequency voltage current circuit battery engine fuel valve pump "
    "pressure temperature volume density mass energy velocity distance angle surface boundary region "
    "estimate sample distribution variance mean median percentile outlier hypothesis experiment observation "
    "measurement accuracy precision recall threshold baseline budget invoice contract payment account "
    "customer supplier inventory shipment warehouse schedule deadline meeting agenda proposal draft summary "
    "chapter section paragraph sentence argument conclusion theory concept principle framework strategy "
    "garden kitchen recipe ingredient flavor oven bread cheese coffee tea river mountain valley forest island "
    "coast harbor bridge tunnel railway airport station village neighborhood museum library gallery theater "
    "concert festival novel poem painting sculpture instrument melody rhythm chorus audience journey trip "
    "map route vehicle bicycle train ship flight ticket passenger luggage hotel border climate weather storm "
    "rain snow wind cloud soil crop harvest seed fertilizer livestock insect bird fish species habitat "
    "ecosystem protein cell gene enzyme molecule atom particle wave field orbit planet galaxy telescope "
    "ability absence academy accident accountant achievement acid acquisition adapter adjustment administrator "
    "adventure advertisement advocate aircraft alarm album algorithm allergy alliance allocation alphabet "
    "ambulance amendment amount analogy ancestor anchor animal anniversary announcement annotation antenna "
    "anxiety apartment appetite application appointment approval aquarium arch architect archive arena "
    "armor arrangement arrival article artifact assembly assessment asset assignment assistant assumption "
    "athlete atmosphere attachment attempt attic auction audit author authority avenue award balance balcony "
    "ballot bandwidth banner bargain barrel basement basket beach beam bearing behavior belief bench bias "
    "biography biscuit blanket blueprint blossom bonus bottle bottleneck boundary bracket brand breakfast "
    "brick brochure bucket bulletin bundle bureau butter button cabinet cable calculator calendar camera "
    "campaign canal candidate candle canvas capacity capital caption carbon career cargo carpet cartoon "
    "castle catalog category ceiling cemetery ceremony certificate chain chair challenge champion channel "
    "chaos character charity chart checkpoint chemistry chicken chimney chip chocolate citizen civilization "
    "claim clause clay cliff clinic clock closet coalition coat cocktail code coin collar colleague "
    "collection colony column comedy comfort commander comment commission committee commodity companion "
    "comparison compass compensation competition compiler complaint component compromise condition "
    "conference confidence conflict confusion congress connection consensus consequence constant "
    "constitution constraint consultant consumer contest context continent contribution convention "
    "conversation cooperation coordinate copper corner corporation corridor cottage cotton council counter "
    "courage cousin coverage crane credential crew cricket crisis criterion critic crowd crystal cupboard "
    "curiosity currency curriculum curtain cushion cycle dairy damage dashboard debate debt decade deck "
    "declaration defect deficit delay delegate delivery demand democracy dentist department deposit "
    "depression deputy descendant desert designer desk dessert destination detail detective diagram "
    "dialect diameter diamond diary diet dimension dinner diploma disaster discipline discount discovery "
    "disease dispute distinction district document dolphin domain donation dose draft dragon drawer dream "
    "dressing duration dust duty eagle earthquake editor efficiency election elephant elevator embassy "
    "emergency emission emotion emphasis empire employee encounter encryption endpoint engineer enterprise "
    "entrance envelope episode equation era essay estate ethics exhibition expansion expedition expense "
    "expert explosion export exposure extension fabric facility faculty failure fairness fault feature "
    "federation fence festival fiber fiction finance fireplace firmware fixture flame fleet flood flour "
    "folder footnote forecast formula fortune fossil foundation fraction fragment franchise freight "
    "frontier fruit funeral furniture gadget galaxy gallon gateway generation genre geometry ghost glacier "
    "glove goal governor grammar grant granularity gravity grocery guarantee guardian guidance guideline "
    "guitar hammer handler harbor hazard headline heritage hierarchy highway hobby holiday horizon hospital "
    "household humor hunger hurricane identity illusion immigrant implementation import incentive incident "
    "income indicator infection inflation infrastructure inheritance initiative injury innovation insight "
    "inspection installation institution insurance integration intensity intention interval interview "
    "invention investigation invitation iteration jacket jewelry journal judgment junction jury keyboard "
    "kingdom knife ladder landscape laptop latency lawyer lecture ledger legend leisure lesson letter "
    "liability license lifetime limitation literature lobby locomotive logic lottery machine magazine "
    "magnitude mailbox mainframe majority manager manifest manuscript marathon margin marriage mechanism "
    "membrane memorial merchant mercy mesh metaphor microscope middleware migration milestone mineral "
    "minister miracle mirror mission mixture monitor monument mortgage motion motivation motor mountain "
    "mustard mystery namespace narrative navigation negotiation nephew nest newsletter niece notebook "
    "notification nutrient obligation occasion offset opinion opponent orchestra organ outcome outline "
    "output oxygen package palace pamphlet panel parade parcel parliament partition partnership passport "
    "password pasta pattern pavement payload peasant pencil pension pepper percentage performance permit "
    "perspective petition philosophy photograph physician piano pilgrim pillow pioneer pipeline pitch "
    "platform playlist pleasure plugin pocket poetry polygon portfolio portion portrait possession poster "
    "pottery poverty prairie prefix premium prescription presence preview priority prison privilege "
    "probability procedure profession professor profit progress prophet proportion prosecutor prototype "
    "province publication pudding pulse puzzle pyramid quality quantity quarter quota rabbit radar radius "
    "railroad ranch ratio reaction reader recession recipient recognition recommendation recovery "
    "recruit referee reflection reform refrigerator refugee registry regulation rehearsal relay relief "
    "religion remedy renaissance rental repository representative reputation reservoir resident "
    "resolution resource restaurant retirement revenue revision revolution reward ribbon rifle ritual "
    "rival robot rocket romance roof rubber runtime sacrifice saddle salary salmon sandwich satellite "
    "satisfaction sauce scandal scholar scope scratch screen script sculpture secretary sector segment "
    "selection semester seminar senator sensitivity sentiment serializer settlement shadow shelf shelter "
    "sheriff shortcut shoulder shrimp sibling sidebar signature silence silver simulation skeleton "
    "sketch slice slogan snapshot socket soldier solution sovereignty spectrum speech sphere spine "
    "sponsor spreadsheet stadium staircase stake statement statue stimulus stomach storage stove "
    "stranger substance suburb subscription successor suggestion suitcase summit supermarket surgeon "
    "survey suspect symbol symptom syndrome syntax tablet tactic talent tenant tendency terminal "
    "territory testimony textbook texture theme therapy thesis threshold throughput timestamp tobacco "
    "toilet tolerance tomato tongue topology tournament tower tradition tragedy transaction transcript "
    "transition translation transparency treasure treaty tribe trigger trophy tuition tutorial twin "
    "umbrella uncertainty undergraduate uniform universe upload utility vaccine validator vendor venture "
    "verdict vessel veteran victim village vinegar violation virtue visa vision vocabulary volunteer "
    "voucher wagon wallet warranty wealth website wedding welfare wheel whistle widget wilderness "
    "witness workshop wrapper yard yield zone"
)
VERBS = _words(
    "be have do say get make go know take see come think look want give use find tell ask work seem feel "
    "try leave call need become keep let begin help show hear play run move live believe hold bring happen "
    "write provide sit stand lose pay meet include continue set learn change lead understand watch follow "
    "stop create speak read allow add spend grow open walk win offer remember consider appear buy wait serve "
    "die send expect build stay fall cut reach kill remain suggest raise pass sell require report decide pull "
    "return explain hope develop carry break receive agree support hit produce eat cover catch draw choose "
    "cause point compute parse render encode decode compile deploy configure install update upgrade migrate "
    "refactor optimize measure validate verify check handle process load store save write fetch cache "
    "compress split merge sort filter reduce map pack shuffle sample train evaluate predict tune schedule "
    "allocate release lock retry restart monitor debug trace profile benchmark document review approve "
    "reject replace remove rename convert transform normalize estimate compare improve reduce increase "
    "avoid prevent ensure enable disable detect ignore skip drop truncate pad append insert extend limit "
    "plant harvest cook bake boil travel visit explore paint sing dance publish translate negotiate invest "
    "abandon accelerate accept accommodate accumulate achieve acknowledge acquire adapt adjust administer "
    "adopt advise advocate aggregate align alter analyze annotate anticipate apologize apply appreciate "
    "archive arrange assemble assert assess assign assist assume attach attempt attend attract authenticate "
    "authorize automate backfill balance batch borrow broadcast browse calculate calibrate cancel capture "
    "categorize celebrate certify challenge characterize clarify classify clone collaborate collapse "
    "collect combine comment commit communicate compensate complain complete comply compose concatenate "
    "conclude conduct confirm connect consolidate construct consult consume contribute coordinate correct "
    "correlate criticize customize declare decline decompress dedicate deduplicate defend define delegate "
    "delete deliver demonstrate deny depend deprecate derive describe deserialize design destroy determine "
    "diagnose differ discover discuss dispatch display distinguish distribute divide donate download "
    "duplicate earn edit educate elaborate eliminate embed emerge emphasize employ emulate encourage "
    "encrypt endorse enforce engage enhance enqueue enroll enumerate escape establish evacuate examine "
    "exceed exchange execute exhibit expand experiment expire export expose express facilitate fail "
    "flatten flush forecast forget format forward freeze fulfill gather generate govern grant guarantee "
    "guess hash highlight hire host identify illustrate implement import impose indicate infer inform "
    "inherit initialize inject inspect instantiate integrate intend interact interpret interrupt "
    "introduce invalidate investigate invoke isolate iterate join justify label launch lean license "
    "link listen locate log maintain manage manipulate mark master materialize mention minimize mirror "
    "mitigate model modify mount multiply navigate notice notify obtain occupy occur operate oppose "
    "orchestrate organize originate outline overlap override own paginate participate partition patch "
    "perceive perform permit persist persuade pipe poll populate possess postpone practice precompute "
    "prefer prepare present preserve pretend prioritize proceed program prohibit promote prompt propose "
    "protect prove provision prune purchase pursue qualify quantify query quote rank rate react realize "
    "rebuild recall recognize recommend reconcile record recover recruit redirect refer reflect refresh "
    "register regret regulate reinforce relate relax rely render renew reorganize repair repeat rephrase "
    "replicate represent request rescue resemble reserve reset resize resolve respond restore restrict "
    "resume retain retrieve reveal reverse revise reward rewrite rotate route sanitize scale scan "
    "schedule score scrape search secure select separate serialize settle shard share shift simplify "
    "simulate slice solve specify spawn stabilize stream strengthen stretch structure submit subscribe "
    "substitute succeed summarize supervise suppress surround survive suspend sustain swap switch "
    "synchronize tag target teach terminate thank throttle tokenize tolerate trade transfer translate "
    "transmit trigger trust uncover undergo underline undo unify unlock unpack upload utilize vary "
    "vectorize visualize vote warn weigh withdraw wrap yield zip"
)
NAMES = _words(
    "Alice Bob Carol David Emma Frank Grace Henry Irene James Karen Liam Maria Noah Olivia Peter Quinn Rosa "
    "Samuel Tara Umar Victor Wendy Xavier Yara Zoe Chen Priya Kenji Amara Lukas Sofia Mateo Aisha Dmitri "
    "Ingrid Omar Hana José Zoë Renée André Søren Björn Łukasz Dvořák Müller Gómez Núñez François Chloé "
    "Jürgen Anaïs Ángel"
)
PLACES = _words(
    "London Paris Berlin Madrid Rome Lisbon Dublin Oslo Stockholm Helsinki Warsaw Prague Vienna Athens Cairo "
    "Nairobi Lagos Mumbai Delhi Tokyo Osaka Seoul Beijing Shanghai Sydney Toronto Chicago Boston Denver "
    "Seattle Austin Lima Bogotá Santiago Montréal Zürich Kraków München Malmö Reykjavík Göteborg Köln "
    "São_Paulo Brasília Düsseldorf Córdoba Curaçao"
)
FOREIGN = [
    "Merci beaucoup pour votre aide, c'est très clair maintenant.",
    "Je ne suis pas sûr que ce soit la meilleure approche, mais ça marche.",
    "Könnten Sie das bitte noch einmal genauer erklären?",
    "Die Ergebnisse sind überraschend gut, aber die Laufzeit ist zu hoch.",
    "¿Podrías darme un ejemplo más concreto, por favor?",
    "La función devuelve un valor incorrecto cuando la lista está vacía.",
    "Obrigado! Isso resolveu o problema de codificação.",
    "Questo è esattamente ciò di cui avevo bisogno.",
    "Спасибо, теперь всё понятно. Попробую завтра.",
    "Данные загружаются слишком медленно, что можно сделать?",
    "这个方法在大数据集上运行得很慢，有什么优化建议吗？",
    "谢谢你的详细解释，我明白了。",
    "この関数の戻り値について教えてください。",
    "ありがとうございます。とても分かりやすいです。",
    "이 코드를 더 빠르게 만들 수 있는 방법이 있을까요?",
    "شكرا جزيلا على المساعدة، هذا مفيد جدا.",
    "क्या आप इसे सरल शब्दों में समझा सकते हैं?",
    "Dziękuję, to bardzo pomocne wyjaśnienie.",
    "Çok teşekkürler, şimdi anladım.",
    "Tämä ratkaisu toimii hyvin pienillä aineistoilla.",
    "Ευχαριστώ πολύ για τη βοήθεια.",
    "Cảm ơn bạn rất nhiều, mình sẽ thử lại.",
]
EMOJI = ["🙂", "👍", "🚀", "✅", "⚠️", "🔥", "🤔", "🎉", "📈", "💡"]
UNITS = ["ms", "s", "MB", "GB", "KB", "km", "kg", "m", "%", "°C", "tokens", "rows", "items", "requests", "users"]
SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a helpful, respectful and honest assistant. Answer as helpfully as possible while being safe.",
    "You are an expert software engineer. Answer with working code and short explanations.",
    "You are a concise assistant. Keep answers short unless asked for detail.",
    "You are a friendly tutor who explains concepts step by step, with examples.",
    "You are a data analyst. Show your reasoning and state your assumptions clearly.",
    "Eres un asistente útil. Responde en el idioma del usuario.",
]
SHORT_USER = [
    "Thanks!",
    "Can you elaborate?",
    "Why?",
    "Could you give an example?",
    "That didn't work, I still get the same error.",
    "Great, what about the edge cases?",
    "Can you make it shorter?",
    "OK. And if the input is empty?",
    "Perfect, thank you 🙂",
    "Hmm, are you sure about that?",
]
QUESTION_OPENERS = [
    "How do I",
    "What is the best way to",
    "Can you explain how to",
    "Why does it",
    "Is it possible to",
    "What happens if I",
    "Could you help me",
    "I'm trying to",
    "What's the difference between",
    "Should I",
]


IRREGULAR_PLURALS = {
    "man": "men",
    "woman": "women",
    "child": "children",
    "person": "people",
    "foot": "feet",
    "kid": "kids",
    "analysis": "analyses",
    "hypothesis": "hypotheses",
    "matrix": "matrices",
    "index": "indices",
    "life": "lives",
    "wife": "wives",
    "leaf": "leaves",
}
UNCOUNTABLE = frozenset(
    _words(
        "people data information news evidence research education health music art air water money oil "
        "attention support software hardware equipment feedback advice traffic weather soil fuel"
    )
)
IRREGULAR_PAST = {
    "be": "was",
    "have": "had",
    "do": "did",
    "say": "said",
    "get": "got",
    "make": "made",
    "go": "went",
    "know": "knew",
    "take": "took",
    "see": "saw",
    "come": "came",
    "think": "thought",
    "give": "gave",
    "find": "found",
    "tell": "told",
    "feel": "felt",
    "leave": "left",
    "keep": "kept",
    "let": "let",
    "begin": "began",
    "show": "showed",
    "hear": "heard",
    "run": "ran",
    "hold": "held",
    "bring": "brought",
    "write": "wrote",
    "sit": "sat",
    "stand": "stood",
    "lose": "lost",
    "pay": "paid",
    "meet": "met",
    "lead": "led",
    "understand": "understood",
    "speak": "spoke",
    "read": "read",
    "spend": "spent",
    "grow": "grew",
    "win": "won",
    "buy": "bought",
    "send": "sent",
    "build": "built",
    "fall": "fell",
    "cut": "cut",
    "set": "set",
    "break": "broke",
    "eat": "ate",
    "catch": "caught",
    "draw": "drew",
    "choose": "chose",
    "split": "split",
    "sell": "sold",
    "hit": "hit",
    "become": "became",
    "die": "died",
}
# Verbs that double their last consonant before -ed and -ing.
DOUBLING = frozenset(
    _words(
        "stop drop log skip pad commit tag zip swap wrap occur prefer permit submit plan ship map step scan "
        "plug trim ban shut fit spot control refer transfer regret omit emit pin grab chat"
    )
)
IRREGULAR_PRESENT = {"be": "is", "have": "has", "do": "does", "go": "goes"}


def _inflect_noun(word: str) -> str:
    if word in UNCOUNTABLE:
        return word
    if word in IRREGULAR_PLURALS:
        return IRREGULAR_PLURALS[word]
    if word.endswith(("s", "x", "ch", "sh")):
        return word + "es"
    if word.endswith("y") and word[-2:-1] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


def _inflect_verb(word: str, form: str) -> str:
    if form == "s":
        if word in IRREGULAR_PRESENT:
            return IRREGULAR_PRESENT[word]
        if word.endswith(("s", "x", "ch", "sh")):
            return word + "es"
        if word.endswith("y") and word[-2:-1] not in "aeiou":
            return word[:-1] + "ies"
        return word + "s"
    if form == "ed":
        if word in IRREGULAR_PAST:
            return IRREGULAR_PAST[word]
        if word.endswith("y") and word[-2:-1] not in "aeiou":
            return word[:-1] + "ied"
        if word in DOUBLING:
            return word + word[-1] + "ed"
        return word + ("d" if word.endswith("e") else "ed")
    if word in DOUBLING:
        return word + word[-1] + "ing"
    if word.endswith("ie"):
        return word[:-2] + "ying"
    stem = word[:-1] if word.endswith("e") and word not in ("be", "see", "free") else word
    return stem + "ing"


class Vocab:
    """A part of speech: words drawn with Zipf-like weights (1 / (rank + 4))."""

    def __init__(self, words: list[str]) -> None:
        seen: dict[str, None] = {}
        for w in words:
            seen.setdefault(w, None)
        self.words = list(seen)
        self.cum = list(itertools.accumulate(1.0 / (r + 4) for r in range(len(self.words))))

    def pick(self, rng: random.Random) -> str:
        return self.words[bisect.bisect(self.cum, rng.random() * self.cum[-1])]


NOUN = Vocab(NOUNS)
VERB = Vocab(VERBS)
ADJ = Vocab(ADJECTIVES)
ADV = Vocab(ADVERBS)
PREP = Vocab(PREPOSITIONS)
DET1 = Vocab(SINGULAR_DETERMINERS)
DETN = Vocab(PLURAL_DETERMINERS)
PRON = Vocab(PRONOUNS)
CONJ = Vocab(CONJUNCTIONS)


class Writer:
    """Builds text for one conversation from one random generator."""

    def __init__(self, rng: random.Random, multilingual: bool) -> None:
        self.rng = rng
        self.multilingual = multilingual

    # -- words and phrases -----------------------------------------------------------------------

    def number(self) -> str:
        r = self.rng
        kind = r.random()
        if kind < 0.3:
            return str(r.randint(2, 99))
        if kind < 0.5:
            return f"{r.randint(100, 99999):,}"
        if kind < 0.65:
            return f"{r.uniform(0, 100):.{r.randint(1, 3)}f}"
        if kind < 0.75:
            return str(r.randint(1950, 2030))
        if kind < 0.85:
            return f"{r.randint(0, 4)}.{r.randint(0, 20)}.{r.randint(0, 9)}"
        if kind < 0.92:
            return f"{r.randint(1, 28):02d}/{r.randint(1, 12):02d}/{r.randint(2000, 2029)}"
        return f"0x{r.getrandbits(32):08x}"

    def noun_phrase(self) -> str:
        return self._noun_phrase()[0]

    def _noun_phrase(self) -> tuple[str, bool]:
        """Return a noun phrase and whether it is plural."""
        r = self.rng
        plural = r.random() < 0.3
        parts = []
        if r.random() < 0.35:
            parts.append(ADJ.pick(r))
        if r.random() < 0.12:
            parts.append(NOUN.pick(r))  # a compound: "the cache layer"
        noun = NOUN.pick(r)
        parts.append(_inflect_noun(noun) if plural else noun)
        det = (DETN if plural or noun in UNCOUNTABLE else DET1).pick(r)
        if det == "a" and parts[0][0] in "aeiou":
            det = "an"
        parts.insert(0, det)
        if r.random() < 0.06:
            if r.random() < 0.5:
                parts, plural = [self.number(), r.choice(UNITS)], True
            else:
                parts, plural = [r.choice(NAMES)], False
        if r.random() < 0.04:
            parts.append(f"({self.number()} {r.choice(UNITS)})")
        if r.random() < 0.03:
            parts.append("in " + r.choice(PLACES))
        return " ".join(parts), plural

    def verb_phrase(self, plural: bool) -> str:
        r = self.rng
        verb = VERB.pick(r)
        form = r.random()
        if form < 0.35:
            word = ("are" if verb == "be" else verb) if plural else _inflect_verb(verb, "s")
        elif form < 0.6:
            word = _inflect_verb(verb, "ed")
        elif form < 0.75:
            word = r.choice(["can", "should", "will", "might", "must", "would"]) + " " + verb
        elif form < 0.85:
            word = r.choice(["are", "were"] if plural else ["is", "was"]) + " " + _inflect_verb(verb, "ing")
        else:
            word = verb
        if r.random() < 0.15:
            word = ADV.pick(r) + " " + word
        return word

    def clause(self) -> str:
        r = self.rng
        if r.random() < 0.35:
            subject = PRON.pick(r)
            plural = subject in ("we", "you", "they", "I")
        else:
            subject, plural = self._noun_phrase()
        parts = [subject, self.verb_phrase(plural), self.noun_phrase()]
        for _ in range(r.choice((0, 1, 1, 2))):
            parts.append(PREP.pick(r) + " " + self.noun_phrase())
        if r.random() < 0.1:
            parts.append(ADV.pick(r))
        return " ".join(parts)

    def sentence(self) -> str:
        r = self.rng
        text = self.clause()
        if r.random() < 0.35:
            sep = r.choice((", ", ", ", "; ", " — ", ": "))
            text += sep + CONJ.pick(r) + " " + self.clause() if sep == ", " else sep + self.clause()
        if r.random() < 0.05:
            text = f"“{text}”" if r.random() < 0.5 else f'"{text}"'
        if r.random() < 0.04:
            text += f" (see `{self.identifier()}`)"
        end = r.random()
        punct = "." if end < 0.82 else "?" if end < 0.92 else "!" if end < 0.96 else "…"
        text = text[0].upper() + text[1:] + punct
        if self.multilingual and r.random() < 0.08:
            text += " " + r.choice(FOREIGN)
        if r.random() < 0.01:
            text += " " + r.choice(EMOJI)
        return text

    def paragraph(self, max_chars: int) -> str:
        r = self.rng
        out: list[str] = []
        size = 0
        for _ in range(r.randint(2, 7)):
            s = self.sentence()
            out.append(s)
            size += len(s) + 1
            if size >= max_chars:
                break
        return " ".join(out)

    def identifier(self) -> str:
        r = self.rng
        words = [NOUN.pick(r) for _ in range(r.choice((1, 2, 2, 3)))]
        if r.random() < 0.4:
            words.insert(0, VERB.pick(r))
        if r.random() < 0.25:
            return words[0] + "".join(w.capitalize() for w in words[1:])
        return "_".join(words)

    # -- blocks ----------------------------------------------------------------------------------

    def code_block(self, max_chars: int) -> str:
        r = self.rng
        lang = r.choice(("python", "python", "python", "javascript", "sql", "bash", "json", "rust"))
        lines: list[str] = []
        budget = max(200, min(max_chars, 3000))
        maker = getattr(self, f"_code_{lang}")
        while sum(len(x) + 1 for x in lines) < budget:
            lines.extend(maker())
            if lang == "json" or r.random() < 0.3:
                break
        return f"```{lang}\n" + "\n".join(lines) + "\n```"

    def _code_python(self) -> list[str]:
        r = self.rng
        name, a, b = self.identifier(), self.identifier(), self.identifier()
        lines = [f"def {name}({a}, {b}={self.number() if r.random() < 0.5 else 'None'}):"]
        if r.random() < 0.5:
            lines.append(f'    """{self.sentence()}"""')
        lines.append("    result = []")
        lines.append(f"    for item in {a}:")
        lines.append(f"        if item.{NOUN.pick(r)} > {r.randint(0, 1000)}:")
        lines.append(f"            result.append(item.{self.identifier()})")
        if r.random() < 0.5:
            lines.append(f"        elif {b} is not None:")
            lines.append(f'            raise ValueError(f"bad {NOUN.pick(r)}: {{item!r}}")')
        if r.random() < 0.4:
            lines.append(f"    # {self.clause()}")
        lines.append(f"    return sorted(result, key=lambda x: x.{NOUN.pick(r)})")
        lines.append("")
        return lines

    def _code_javascript(self) -> list[str]:
        r = self.rng
        name, arg = self.identifier(), self.identifier()
        return [
            f"async function {name}({arg}) {{",
            f"  const response = await fetch(`/api/{NOUN.pick(r)}/${{{arg}.id}}`);",
            "  if (!response.ok) {",
            f"    throw new Error('{self.clause()}');",
            "  }",
            f"  return (await response.json()).filter((x) => x.{NOUN.pick(r)} !== null);",
            "}",
            "",
        ]

    def _code_sql(self) -> list[str]:
        r = self.rng
        t1, t2 = _inflect_noun(NOUN.pick(r)), _inflect_noun(NOUN.pick(r))
        c1, c2 = self.identifier(), self.identifier()
        return [
            f"SELECT a.{c1}, COUNT(*) AS n, AVG(b.{c2}) AS avg_{NOUN.pick(r)}",
            f"FROM {t1} a",
            f"JOIN {t2} b ON b.{t1[:-1]}_id = a.id",
            f"WHERE a.created_at >= '{r.randint(2015, 2029)}-{r.randint(1, 12):02d}-01'",
            f"GROUP BY a.{c1}",
            f"HAVING COUNT(*) > {r.randint(1, 500)}",
            "ORDER BY n DESC;",
            "",
        ]

    def _code_bash(self) -> list[str]:
        r = self.rng
        d = self.identifier()
        return [
            f"mkdir -p /tmp/{d} && cd /tmp/{d}",
            f"export {NOUN.pick(r).upper()}_{NOUN.pick(r).upper()}={r.randint(1, 64)}",
            f"python -m {self.identifier()} --{NOUN.pick(r)} {self.number()} --output {d}.jsonl 2>&1 | tee run.log",
            f"grep -c '{VERB.pick(r)}' run.log || echo \"no {NOUN.pick(r)} found\"",
        ]

    def _code_json(self) -> list[str]:
        r = self.rng
        obj = {
            self.identifier(): self.number(),
            self.identifier(): [NOUN.pick(r) for _ in range(r.randint(1, 5))],
            self.identifier(): {NOUN.pick(r): r.random() < 0.5, "name": r.choice(NAMES), "city": r.choice(PLACES)},
        }
        return json.dumps(obj, indent=2, ensure_ascii=False).splitlines()

    def _code_rust(self) -> list[str]:
        r = self.rng
        name, ty = self.identifier(), NOUN.pick(r).capitalize()
        return [
            f"pub fn {name}(items: &[{ty}], limit: usize) -> Result<Vec<u32>, String> {{",
            "    let mut out = Vec::with_capacity(items.len());",
            "    for (i, item) in items.iter().enumerate() {",
            f"        if item.{NOUN.pick(r)} > limit {{",
            f'            return Err(format!("{NOUN.pick(r)} {{}} is too large", i));',
            "        }",
            "        out.push(item.id);",
            "    }",
            "    Ok(out)",
            "}",
            "",
        ]

    def bullet_list(self) -> str:
        r = self.rng
        numbered = r.random() < 0.4
        items = []
        for k in range(r.randint(2, 6)):
            head = f"**{ADJ.pick(r).capitalize()} {NOUN.pick(r)}**: " if r.random() < 0.4 else ""
            mark = f"{k + 1}." if numbered else r.choice(("-", "*", "-"))
            items.append(f"{mark} {head}{self.sentence()}")
        return "\n".join(items)

    def table(self) -> str:
        r = self.rng
        cols = [NOUN.pick(r).capitalize() for _ in range(r.randint(2, 4))]
        rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for _ in range(r.randint(2, 6)):
            rows.append("| " + " | ".join(self.number() if r.random() < 0.5 else NOUN.pick(r) for _ in cols) + " |")
        return "\n".join(rows)

    # -- turns -----------------------------------------------------------------------------------

    def user_turn(self, chars: int) -> str:
        r = self.rng
        if chars < 60 or r.random() < 0.08:
            return r.choice(SHORT_USER)
        opener = r.choice(QUESTION_OPENERS)
        parts = [f"{opener} {VERB.pick(r)} {self.noun_phrase()} {PREP.pick(r)} {self.noun_phrase()}?"]
        size = len(parts[0])
        while size < chars:
            roll = r.random()
            if roll < 0.12 and chars - size > 300:
                block = self.code_block(chars - size)
            elif roll < 0.16 and self.multilingual:
                block = r.choice(FOREIGN)
            else:
                block = self.paragraph(chars - size)
            parts.append(block)
            size += len(block) + 2
        return "\n\n".join(parts)

    def assistant_turn(self, chars: int) -> str:
        r = self.rng
        parts: list[str] = []
        size = 0
        while size < chars:
            roll = r.random()
            if roll < 0.12 and chars - size > 400:
                block = self.code_block(chars - size)
            elif roll < 0.25:
                block = self.bullet_list()
            elif roll < 0.3 and parts:
                block = "#" * r.choice((2, 3)) + " " + self.noun_phrase().capitalize()
            elif roll < 0.32:
                block = self.table()
            else:
                block = self.paragraph(chars - size)
            parts.append(block)
            size += len(block) + 2
        return "\n\n".join(parts)


def make_conversation(seed: int, index: int, median_tokens: float, sigma: float) -> dict[str, list[dict[str, str]]]:
    """Return conversation ``index`` of the corpus for ``seed``."""
    rng = random.Random(seed * 1_000_003 + index)
    tokens = max(40.0, rng.lognormvariate(math.log(median_tokens), sigma))
    chars = tokens * CHARS_PER_TOKEN
    writer = Writer(rng, multilingual=rng.random() < 0.12)
    messages: list[dict[str, str]] = []
    if rng.random() < 0.55:
        system = rng.choice(SYSTEM_PROMPTS)
        if rng.random() < 0.3:
            system += " " + writer.paragraph(400)
        messages.append({"role": "system", "content": system})
        chars -= len(system)
    # Exchanges: mostly few, up to 12; longer conversations tend to have more of them.
    turns = min(12, max(1, int(rng.expovariate(1 / (1.2 + tokens / 900))) + 1))
    weights = [rng.uniform(0.5, 1.5) for _ in range(turns)]
    scale = sum(weights)
    for w in weights:
        budget = max(0.0, chars) * w / scale
        user_share = rng.uniform(0.1, 0.4)
        messages.append({"role": "user", "content": writer.user_turn(int(budget * user_share))})
        messages.append({"role": "assistant", "content": writer.assistant_turn(int(budget * (1 - user_share)))})
    return {"messages": messages}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=17_500, help="number of conversations [17500]")
    parser.add_argument("--seed", type=int, default=0, help="random seed [0]")
    parser.add_argument("--median-tokens", type=float, default=1500, help="median tokens per conversation [1500]")
    parser.add_argument("--sigma", type=float, default=0.6, help="lognormal sigma of the conversation size [0.6]")
    parser.add_argument("-o", "--output", default="benchmarks/data/chat.jsonl", help="output JSONL file")
    args = parser.parse_args(argv)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    started = time.perf_counter()
    size = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for i in range(args.conversations):
            line = json.dumps(make_conversation(args.seed, i, args.median_tokens, args.sigma), ensure_ascii=False)
            f.write(line + "\n")
            size += len(line) + 1
    tmp.replace(out)
    print(
        f"wrote {args.conversations} conversations ({size / 1e6:.1f} M characters) to {out} "
        f"in {time.perf_counter() - started:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
