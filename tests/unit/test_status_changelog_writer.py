"""The status view's changelog writer keys a job's records as faust's table
producer did, so the compacted changelog keeps one record per job across an
upgrade (records of both writers compact together)."""

from __future__ import annotations

import pytest
from faust.serializers import codecs

from dueflow.streams.status.changelog_writer import changelog_key
from dueflow.streams.status.job_store import job_id_of_key


@pytest.mark.parametrize("job_id", ["0195f3a07c4e7abc8def0123456789ab", 'é漢"x\\', "\x01 tab\t"])
def test_a_key_is_the_bytes_of_fausts_json_key_serializer(job_id: str) -> None:
    assert changelog_key(job_id) == codecs.dumps("json", job_id)
    assert job_id_of_key(changelog_key(job_id)) == job_id
