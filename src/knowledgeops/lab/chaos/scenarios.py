"""The chaos scenarios: each breaks the scale-out topology one way while work is in flight, lets
it recover and audits the database (lab/chaos/lab.py)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from knowledgeops.jobs.celery_dispatch import CeleryDispatcher, make_celery
from knowledgeops.lab.chaos.lab import (
    KEY,
    Lab,
    ScenarioResult,
    finish,
    job_mid_embedding,
    jobs,
    lab_stats,
    running_owner,
    upload,
    upload_all,
    wait_all,
    wait_until,
)


def worker_killed_mid_embedding(lab: Lab) -> ScenarioResult:
    result = ScenarioResult("kill -9 a worker process mid-embedding")
    with lab.topology("kill_mid") as topology, topology.client() as client:
        lab.control(delay=0.5)  # a batch takes a while: there is a middle to kill in
        files = lab.corpus("kill_mid", 4 if lab.short else 12, paragraphs=8)
        job_ids = upload_all(client, files, result)
        found = job_mid_embedding(topology, client, job_ids, result)
        if found is None:
            return result
        target_id, pid = found
        os.kill(pid, signal.SIGKILL)
        fault_at = time.monotonic()
        lab.control(delay=0.0)
        finish(lab, topology, client, job_ids, result, fault_at)
        if client.get(f"/docs/jobs/{target_id}").json()["attempt"] < 2:
            result.problems.append("the killed job was not run again")
        return result


def worker_paused_past_its_lease(lab: Lab) -> ScenarioResult:
    result = ScenarioResult("worker paused past its lease (SIGSTOP), then resumed")
    with lab.topology("paused") as topology, topology.client() as client:
        lab.control(delay=0.5)
        files = lab.corpus("paused", 3 if lab.short else 8, paragraphs=8)
        job_ids = upload_all(client, files, result)
        found = job_mid_embedding(topology, client, job_ids, result)
        if found is None:
            return result
        target_id, pid = found
        os.kill(pid, signal.SIGSTOP)
        fault_at = time.monotonic()
        lab.control(delay=0.0)

        def taken_over() -> bool:
            job = client.get(f"/docs/jobs/{target_id}").json()
            return bool(job["status"] == "completed")

        try:
            if not wait_until(taken_over, timeout=180):
                result.problems.append("nobody finished the paused worker's job")
        finally:
            os.kill(pid, signal.SIGCONT)  # it wakes up and tries to go on writing
        rejected = wait_until(
            lambda: any("late writes were rejected" in worker.log() for worker in topology.procs),
            timeout=30,
        )
        if not rejected:
            result.problems.append("the resumed worker's late writes were not seen rejected")
        return finish(lab, topology, client, job_ids, result, fault_at)


def killed_before_complete(lab: Lab) -> ScenarioResult:
    result = ScenarioResult("worker dies after the index write, before completed")
    marker = lab.root / "before_complete.spent"
    env = {"KOPS_FAULT": "before_complete", "KOPS_FAULT_ONCE": str(marker)}
    with (
        lab.topology("before_complete", worker_env=env) as topology,
        topology.client() as client,
    ):
        job_ids = upload_all(client, lab.corpus("before_complete", 3 if lab.short else 8), result)
        if not wait_until(marker.exists, timeout=120):
            result.problems.append("the fault point was never reached")
            return result
        finish(lab, topology, client, job_ids, result, time.monotonic())
        if max(job["attempt"] for job in jobs(client, job_ids).values()) < 2:
            result.problems.append("the job whose worker died was not run again")
        return result


def broker_down(lab: Lab) -> ScenarioResult:
    outage = 8.0 if lab.short else 60.0
    result = ScenarioResult(f"Redis stopped {outage:g} s during uploads")
    with lab.topology("broker_down") as topology, topology.client() as client:
        files = lab.corpus("broker_down", 6 if lab.short else 20)
        half = len(files) // 2
        job_ids = upload_all(client, files[:half], result)
        lab.redis.stop()
        fault_at = time.monotonic()
        try:
            job_ids += upload_all(client, files[half:], result)  # each must still be 202
            time.sleep(max(0.0, outage - (time.monotonic() - fault_at)))
        finally:
            lab.redis.start()
        return finish(lab, topology, client, job_ids, result, fault_at)


def postgres_restart(lab: Lab) -> ScenarioResult:
    result = ScenarioResult("PostgreSQL restarted while workers run")
    with lab.topology("pg_restart") as topology, topology.client() as client:
        lab.control(delay=0.2)
        files = lab.corpus("pg_restart", 5 if lab.short else 12)
        job_ids = upload_all(client, files[:-1], result)
        wait_until(lambda: running_owner(client, job_ids) is not None, timeout=60)
        lab.postgres.stop(mode="fast")
        fault_at = time.monotonic()
        try:
            during = upload(client, files[-1])
            if during.status_code == 202:
                result.problems.append("an upload was answered 202 while the database was down")
                result.accepted += 1
                job_ids.append(during.json()["jobId"])
            elif during.status_code != 503 or "retry-after" not in during.headers:
                result.problems.append(
                    f"an upload during the outage got {during.status_code} without Retry-After"
                )
            time.sleep(3.0 if lab.short else 15.0)
        finally:
            lab.postgres.start()
        lab.control(delay=0.0)
        return finish(lab, topology, client, job_ids, result, fault_at)


def relay_killed(lab: Lab) -> ScenarioResult:
    result = ScenarioResult("active relay killed (two relays), then restarted")
    with (
        lab.topology("relay_killed", relays=2) as topology,
        topology.client() as client,
    ):
        files = lab.corpus("relay_killed", 6 if lab.short else 16)
        half = len(files) // 2
        job_ids = upload_all(client, files[:half], result)
        relays = topology.by_role("relay")
        active = next((r for r in relays if "relay: active" in r.log()), None)
        if active is None:
            result.problems.append("no relay was active")
            return result
        (standby,) = [r for r in relays if r is not active]
        active.kill()
        fault_at = time.monotonic()
        job_ids += upload_all(client, files[half:], result)
        if not wait_until(lambda: "relay: active" in standby.log(), timeout=30):
            result.problems.append("the standby relay did not take over")
        topology.start_relay()  # the killed one comes back, as a standby
        return finish(lab, topology, client, job_ids, result, fault_at)


def provider_errors(lab: Lab) -> ScenarioResult:
    result = ScenarioResult("provider 429s and 500s, then 401 until the key is fixed")
    with lab.topology("provider") as topology, topology.client() as client:
        count = 4 if lab.short else 10
        lab.control(mode="throttle", count=count, retry_after=0.5)
        fault_at = time.monotonic()
        job_ids = upload_all(client, lab.corpus("provider", count), result)
        wait_until(lambda: lab_stats(lab)["refused"].get("429", 0) >= count, timeout=60)
        lab.control(mode="error500", count=count)
        if not wait_all(client, job_ids, timeout=240):
            result.problems.append("jobs did not recover from 429s and 500s")
        refused = lab_stats(lab)["refused"]
        if refused.get("429", 0) < count or refused.get("500", 0) < 1:
            result.problems.append(f"the provider's faults did not reach the jobs: {refused}")
        # a wrong key: the jobs fail for the user; once the key is right, retry works
        lab.control(keys=["a-key-nobody-has"])
        locked = upload_all(client, lab.corpus("provider_401", 2), result)
        wait_all(client, locked, timeout=120)
        for job in jobs(client, locked).values():
            if (job["status"], job["errorCategory"]) != ("failed", "user_action_required"):
                result.problems.append(
                    f"with a refused key a job ended {job['status']}/{job['errorCategory']}"
                )
        lab.control(keys=[KEY])
        for job_id in locked:
            answer = client.post(f"/docs/jobs/{job_id}/retry")
            if answer.status_code != 202:
                result.problems.append(f"retry after the key was fixed: {answer.status_code}")
        return finish(lab, topology, client, job_ids + locked, result, fault_at)


def duplicate_delivery(lab: Lab) -> ScenarioResult:

    result = ScenarioResult("every message delivered twice, and again after completion")
    with lab.topology("duplicates") as topology, topology.client() as client:
        lab.control(delay=0.05)
        job_ids = upload_all(client, lab.corpus("duplicates", 6 if lab.short else 20), result)
        dispatcher = CeleryDispatcher(
            make_celery(lab.redis.url(0), job_time_limit_s=300, visibility_timeout_s=900)
        )
        for job_id in job_ids:
            dispatcher.publish(job_id)
        fault_at = time.monotonic()
        if not wait_all(client, job_ids, timeout=240):
            result.problems.append("not every job finished")
        attempts = {job_id: job["attempt"] for job_id, job in jobs(client, job_ids).items()}
        for job_id in job_ids:  # stale redeliveries of finished jobs
            dispatcher.publish(job_id)
        if not wait_until(lambda: dispatcher.backlog() == 0, timeout=60):
            result.problems.append("the stale redeliveries were never taken by a worker")
        time.sleep(1)  # the last one taken is being looked at
        after = {job_id: job["attempt"] for job_id, job in jobs(client, job_ids).items()}
        if after != attempts:
            result.problems.append("a stale redelivery ran a finished job again")
        return finish(lab, topology, client, job_ids, result, fault_at)


SCENARIOS: dict[str, Callable[[Lab], ScenarioResult]] = {
    "kill_mid_embedding": worker_killed_mid_embedding,
    "kill_before_complete": killed_before_complete,
    "worker_paused": worker_paused_past_its_lease,
    "broker_down": broker_down,
    "postgres_restart": postgres_restart,
    "relay_killed": relay_killed,
    "provider_errors": provider_errors,
    "duplicate_delivery": duplicate_delivery,
}
