"""Records to token ids and label masks, exactly as the tokenizer and its chat template give them.

The flow, for one batch of records (in a worker process, or a Ray actor):

1. **record -> sample**: a worker (``batches.worker.tokenize_batch``) parses each raw record, detects its format
   and normalises it into a ``Sample`` (``packcli.records``); ``bounds`` rules out a record certainly
   longer than ``--max-len`` before it is tokenized.
2. **sample -> rendering**: a conversation is rendered by its chat template as ``apply_chat_template``
   renders it (``chat_template``), and the character spans to train on are found: the template's
   ``{% generation %}`` blocks, or else located in the rendering (``spans``) by the template's shape
   (``template_shape``). Prompt/completion and text samples are their own text.
3. **rendering -> ids + label mask**: the ``Encoder`` (``encoder``) encodes the text with the fast
   tokenizer and marks every token whose characters overlap a trained span; a text certainly too long
   for a row is encoded by windows (``long_text``).
4. **split**: with ``--overflow split``, a sample longer than a row becomes several (``split``): a
   conversation at turn boundaries, anything else in consecutive chunks.
5. **worker**: the batch's kept samples go out as flat arrays (a ``TokenizedBatch``), with an entry for
   every record left out (``record_entries.reject``).

The stage that runs batches through the workers into a token store is ``batches.ingest``.

Which subpackage holds what (each says so in its docstring):

- ``templates``: chat templates and what to train in them: the template a run uses (``choice``),
  rendering it as ``apply_chat_template`` does (``rendering``, ``chat_template``), its shape and the
  answers' spans (``template_shape``, ``spans``, ``span_marks``), agent turns (``agentic``), the rounds
  of ``--expand-turns`` (``rounds``), a template's failure in words (``template_errors``).
- ``encoders``: text to ids and masks: the tokenizer (``tokenizer``, ``recorded``), the ``Encoder``
  (``encoder``), the reference and fast text encoders (``text_encoders``, ``probe``, ``byte_offsets``),
  which of them a tokenizer gets and what is learned of it (``encoder_choice``).
- ``batches``: the per-record path: one batch of raw records to a ``TokenizedBatch`` in a worker
  (``worker``, ``record_entries``), and stage one in the run's process (``ingest``,
  ``building``, ``estimate``).
- ``long``: samples longer than a row: the early too-long rule (``bounds``), long texts by windows
  (``long_text``), ``--overflow split``'s pieces (``split``).
- At the top: ``options`` (``TokenizeOptions``), ``images`` (image samples) and ``trees`` (prefix trees).
"""
