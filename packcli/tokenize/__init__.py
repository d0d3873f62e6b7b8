"""Records to token ids and label masks, exactly as the tokenizer and its chat template give them.

The flow, for one batch of records (in a worker process, or a Ray actor):

1. **record -> sample**: a worker (``worker.tokenize_batch``) parses each raw record, detects its format
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

The stage that runs batches through the workers into a token store is ``ingest``.

Which module holds what:

- ``tokenizer``: finding and loading the tokenizer (the default one, a directory, a Hub name), the
  cache key's fingerprint of its files, and the manifest's tokenizer sha256.
- ``templates``: which chat template a run uses (packcli's own in ``packcli/templates/``, a file, or
  the tokenizer's), and reading them.
- ``chat_template``: rendering a template, its content modes and markers, and the character spans that
  ``--train-on`` trains.
- ``template_shape``: a template's assistant header and end markers, learned from probe conversations.
- ``spans``: each assistant answer's span in a rendering, for templates without generation blocks.
- ``encoder``: ``EncodeOptions`` and the ``Encoder``: samples to (input_ids, labels).
- ``long_text``: a text too long for a row, encoded by joined windows in bounded memory.
- ``bounds``: the early too-long rule (a lower bound on tokens from UTF-8 bytes).
- ``split``: ``--overflow split``'s pieces.
- ``worker``: one batch of raw records to a ``TokenizedBatch``, and the worker's context.
- ``json_line``: a JSON line decoded into a record, or the error that says why not.
- ``record_entries``: the entries of the rejects file and of the --fix-turns-log.
- ``ingest``: stage 1, every record tokenized and accounted for, into a token store.
"""
