"""Hand-written Avro binary for the records a worker handles per job.

A worker decodes one Job and encodes one Outcome and one IdempotencyRecord
per job: with fastavro that is ~20 us of a ~30 us budget per job. The
functions of this codec do the same for version 1 of those schemas in a few
microseconds, byte for byte what fastavro writes (the unit tests compare
them on generated records). Any other schema version goes through
:mod:`dueflow.records.codec`, which resolves versions.

Outcome versions 1 and 2 have the same layout (2 adds enum symbols);
version 3 appends optional fields, so a version 3 value is the version 2
bytes followed by those fields (:func:`encode_outcome_v3`). Writers keep
writing version 1 or 2 when nothing of version 3 is used.

The codec's names, importable from here: the decoders of
:mod:`dueflow.records.worker_decoder`, the encoders of
:mod:`dueflow.records.worker_encoder`, and the schema headers and state
symbols of :mod:`dueflow.records.worker_schemas`.
"""

from __future__ import annotations

from dueflow.records.worker_decoder import F_BACKOFF as F_BACKOFF
from dueflow.records.worker_decoder import F_CONTENT_HASH as F_CONTENT_HASH
from dueflow.records.worker_decoder import F_CONTENT_TYPE as F_CONTENT_TYPE
from dueflow.records.worker_decoder import F_CREATED_MS as F_CREATED_MS
from dueflow.records.worker_decoder import F_DUE_MS as F_DUE_MS
from dueflow.records.worker_decoder import F_JITTER_MS as F_JITTER_MS
from dueflow.records.worker_decoder import F_JOB_ID as F_JOB_ID
from dueflow.records.worker_decoder import F_KEY as F_KEY
from dueflow.records.worker_decoder import F_LABELS as F_LABELS
from dueflow.records.worker_decoder import F_MAX_ATTEMPTS as F_MAX_ATTEMPTS
from dueflow.records.worker_decoder import F_PAYLOAD as F_PAYLOAD
from dueflow.records.worker_decoder import F_QUEUE as F_QUEUE
from dueflow.records.worker_decoder import F_SCHEDULE_ID as F_SCHEDULE_ID
from dueflow.records.worker_decoder import F_SCHEDULE_VERSION as F_SCHEDULE_VERSION
from dueflow.records.worker_decoder import F_TASK as F_TASK
from dueflow.records.worker_decoder import F_TIMEOUT_MS as F_TIMEOUT_MS
from dueflow.records.worker_decoder import F_TRACE as F_TRACE
from dueflow.records.worker_decoder import JobFields as JobFields
from dueflow.records.worker_decoder import _bytes as _bytes
from dueflow.records.worker_decoder import _str as _str
from dueflow.records.worker_decoder import _varint as _varint
from dueflow.records.worker_decoder import decode_job as decode_job
from dueflow.records.worker_decoder import decode_job_fields as decode_job_fields
from dueflow.records.worker_decoder import decode_key_record as decode_key_record
from dueflow.records.worker_decoder import decode_key_state as decode_key_state
from dueflow.records.worker_encoder import _s as _s
from dueflow.records.worker_encoder import _zigzag as _zigzag
from dueflow.records.worker_encoder import encode_key_state as encode_key_state
from dueflow.records.worker_encoder import encode_outcome as encode_outcome
from dueflow.records.worker_encoder import encode_outcome_v3 as encode_outcome_v3
from dueflow.records.worker_encoder import encode_scheduled as encode_scheduled
from dueflow.records.worker_encoder import encode_success as encode_success
from dueflow.records.worker_encoder import outcome_header as outcome_header
from dueflow.records.worker_encoder import result_tail as result_tail
from dueflow.records.worker_schemas import IDEMPOTENCY_V1 as IDEMPOTENCY_V1
from dueflow.records.worker_schemas import IDEMPOTENCY_V2 as IDEMPOTENCY_V2
from dueflow.records.worker_schemas import JOB_STATES as JOB_STATES
from dueflow.records.worker_schemas import JOB_V1 as JOB_V1
from dueflow.records.worker_schemas import KEY_STATES as KEY_STATES
from dueflow.records.worker_schemas import KEY_STATES_V1 as KEY_STATES_V1
from dueflow.records.worker_schemas import OUTCOME_V1 as OUTCOME_V1
from dueflow.records.worker_schemas import OUTCOME_V2 as OUTCOME_V2
from dueflow.records.worker_schemas import OUTCOME_V3 as OUTCOME_V3
from dueflow.records.worker_schemas import V2_STATES as V2_STATES
from dueflow.records.worker_schemas import V3_STATES as V3_STATES
