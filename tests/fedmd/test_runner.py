"""The FedMD runner: NFDP touches nothing but the sample, resume is lossless, reports are honest."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxdistill import _files
from jaxdistill import fedmd
from jaxdistill.data import ImageData
from jaxdistill.models import CNNSpec

from tests.fedmd.conftest import tiny_config, tiny_data
from tests.fedmd.test_ldp_privacy import delta_by_hand


def run(key, cfg, data, **kw):
  # The LDP sigma table (several PLD calibrations) is checked in test_privacy_report_per_party
  # and tests/fedmd/test_ldp_privacy.py; elsewhere it would only cost time.
  kw.setdefault("ldp_table_epsilons", ())
  return fedmd.run_fedmd(key, cfg, data, **kw)


def leaves(result):
  out = []
  for _, _, _, state in result.groups:
    out += [np.asarray(x) for x in jax.tree.leaves(state)]
  return out


def assert_bitwise_equal(a, b):
  np.testing.assert_array_equal(a.releases, b.releases)
  np.testing.assert_array_equal(a.consensus, b.consensus)
  np.testing.assert_array_equal(a.accuracy, b.accuracy)
  for u, v in zip(leaves(a), leaves(b)):
    np.testing.assert_array_equal(u, v)


def poisoned(data, keep, *, image_value=np.nan, label_shift=1):
  """Every record whose index is not in keep[i] gets NaN pixels and a wrong (in-range) label."""
  parties = []
  for p, idx in zip(data.parties, keep):
    x, y = p.images.copy(), p.labels.copy()
    mask = np.ones(len(p), bool)
    mask[np.asarray(sorted(set(np.concatenate(idx).tolist())), int)] = False
    lo = data.num_public_classes
    y[mask] = lo + (y[mask] - lo + label_shift) % (data.num_classes - lo)
    party = ImageData(x, y, p.num_classes, p.name)
    party.images[mask] = image_value  # after construction, which refuses NaN pixels
    parties.append(party)
  return dataclasses.replace(data, parties=tuple(parties))


@pytest.mark.parametrize("kw", [
    dict(),
    dict(with_replacement=True, aggregation="softmax"),
    dict(resample_each_round=True, aggregation="logits"),
], ids=["wor-argmax", "wr-softmax", "resampled-logits"])
def test_unsampled_private_records_are_never_touched(data3, kw):
  cfg = tiny_config(**kw)
  key = jax.random.key(11)
  clean = run(key, cfg, data3, record_releases=True)
  drawn = clean.samples
  assert all(len(d) == (cfg.rounds if cfg.resample_each_round else 1) for d in drawn)
  bad = poisoned(data3, drawn)
  assert all(np.isnan(p.images).any() for p in bad.parties)  # the poison is really there
  dirty = run(key, cfg, bad, record_releases=True)
  for a, b in zip(clean.samples, dirty.samples):
    for u, v in zip(a, b):
      np.testing.assert_array_equal(u, v)
  assert np.isfinite(dirty.releases).all()
  assert_bitwise_equal(clean, dirty)
  # Control: changing party 0's *sampled* records (all of them: one alone can leave every argmax vote as it
  # was) does change its released predictions.
  i, j = 0, np.asarray(drawn[0][0], int)
  x = data3.parties[0].images.copy()
  x[j] = 1.0 - x[j]
  moved = dataclasses.replace(data3, parties=(ImageData(x, data3.parties[0].labels, data3.num_classes),)
                              + data3.parties[1:])
  other = run(key, cfg, moved, record_releases=True)
  assert not np.array_equal(other.releases[:, i], clean.releases[:, i])


class Interrupt(Exception):
  pass


def test_resume_equals_an_uninterrupted_run(data3, tmp_path):
  cfg = tiny_config(rounds=3)
  key = jax.random.key(5)
  full = run(key, cfg, data3, checkpoint_dir=tmp_path / "a", record_releases=True)

  def stop(r, info):
    if r == 1:
      raise Interrupt()

  with pytest.raises(Interrupt):
    run(key, cfg, data3, checkpoint_dir=tmp_path / "b", record_releases=True, on_round_end=stop)
  resumed = run(key, cfg, data3, checkpoint_dir=tmp_path / "b", resume=True, record_releases=True)
  assert resumed.resumed_from == 1
  # Bitwise: the same compiled programs on the same inputs; every key is fold_in(root, phase, round).
  assert_bitwise_equal(full, resumed)
  assert resumed.eval_rounds == full.eval_rounds == [0, 1, 2, 3]
  # No second draw: the sample came from the checkpoint, so the privacy cost is unchanged.
  assert [len(d) for d in resumed.samples] == [1, 1, 1]
  assert resumed.privacy[0]["exact"]["delta_for_every_epsilon"] == full.privacy[0]["exact"]["delta_for_every_epsilon"]
  # Timings: the phases are summed over both sessions (pre-training ran in the first one only), so they are
  # bounded by the two sessions' total, not by this session's (the report's phases summed to 12.6 s beside a
  # total of 3.4 s).
  tm = resumed.timings
  phases = sum(tm[k] for k in ("pretrain", "init_train", "predict", "digest", "revisit", "evaluate", "checkpoint"))
  assert tm["pretrain"] > 0 and tm["earlier_sessions"] > tm["pretrain"] + tm["init_train"]
  assert tm["total_all_sessions"] == tm["earlier_sessions"] + tm["total_this_session"]
  assert phases <= tm["total_all_sessions"]
  assert full.timings["earlier_sessions"] == 0.0 and full.timings["total_all_sessions"] == full.timings[
      "total_this_session"]
  # Resuming a finished run changes nothing.
  again = run(key, cfg, data3, checkpoint_dir=tmp_path / "b", resume=True, record_releases=True)
  assert again.resumed_from == 3
  assert_bitwise_equal(full, again)


def test_resume_refuses_a_checkpoint_trained_with_the_other_vmap_mode(data3, tmp_path, monkeypatch):
  # vmap="auto" resolves by backend: stopped on CPU (looped) and resumed on an accelerator (vmapped), the run mixed
  # the two float paths (party 0's parameters 4.6e-4 from the uninterrupted run's) and reported vmap=True.
  cfg = tiny_config(rounds=2, vmap="auto")
  key = jax.random.key(5)

  def stop(r, info):
    raise Interrupt()

  with pytest.raises(Interrupt):
    run(key, cfg, data3, checkpoint_dir=tmp_path / "b", on_round_end=stop)
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  with pytest.raises(ValueError, match=r"trained with vmap=off.*resolves vmap='auto' to on.*--vmap") as err:
    run(key, cfg, data3, checkpoint_dir=tmp_path / "b", resume=True)
  assert "\n" not in str(err.value)


def test_resume_refuses_a_checkpoint_trained_in_the_other_x64_mode(data3, tmp_path):
  # optax's Adam corrects its bias in float64 under x64, so the two modes train different parameters: stopped with
  # x64 off and resumed with it on, the run matched neither uninterrupted run, without a word.
  cfg = tiny_config(rounds=2, pretrain_epochs=0)
  key = jax.random.key(5)

  def stop(r, info):
    raise Interrupt()

  with pytest.raises(Interrupt):
    run(key, cfg, data3, checkpoint_dir=tmp_path / "b", on_round_end=stop)
  with jax.enable_x64(True):
    with pytest.raises(ValueError, match=r"trained with jax_enable_x64=False and this process has "
                                         r"jax_enable_x64=True") as err:
      run(key, cfg, data3, checkpoint_dir=tmp_path / "b", resume=True)
  assert "\n" not in str(err.value)
  assert run(key, cfg, data3, checkpoint_dir=tmp_path / "b", resume=True).resumed_from == 1  # its own mode: fine


def test_the_pretraining_memo_keeps_the_x64_modes_apart(data3, monkeypatch):
  # The memo of public pre-training left the x64 mode out of its key: a run with x64 on after one with it off
  # started from the x64-off weights (party 2's accuracy 0.083 where a fresh x64 run has 0.104).
  monkeypatch.setattr(fedmd._runner, "_PRETRAINED", {})  # pylint: disable=protected-access
  cfg, key = tiny_config(rounds=0, init_epochs=0, pretrain_epochs=2), jax.random.key(0)
  with jax.enable_x64(True):
    fresh = leaves(run(key, cfg, data3))
  fedmd._runner._PRETRAINED.clear()  # pylint: disable=protected-access
  off = leaves(run(key, cfg, data3))
  with jax.enable_x64(True):
    after_off = leaves(run(key, cfg, data3))
  assert any(not np.array_equal(u, v) for u, v in zip(fresh, off))  # the two modes do differ here
  for u, v in zip(fresh, after_off):
    np.testing.assert_array_equal(u, v)
  # One entry per group (parties of one architecture) and mode.
  assert len(fedmd._runner._PRETRAINED) == 2 * len(set(cfg.party_specs()))  # pylint: disable=protected-access


def test_a_checkpoint_dir_is_held_by_one_run_and_tidied_after_an_early_failure(data3, tmp_path):
  # Two runs checkpointing into one folder would overwrite each other's rounds.
  cfg, key, ckpt = tiny_config(rounds=1), jax.random.key(5), tmp_path / "c"
  ckpt.mkdir()
  with _files.claimed_dir("checkpoint_dir", ckpt):  # another run, as far as flock is concerned
    with pytest.raises(ValueError, match="used by one run at a time") as err:
      run(key, cfg, data3, checkpoint_dir=ckpt)
  assert "\n" not in str(err.value) and not list(ckpt.iterdir())

  def held(r, info):  # the folder stays held while the run works
    with pytest.raises(ValueError, match="used by one run at a time"):
      with _files.claimed_dir("checkpoint_dir", ckpt):
        pass
    seen.append(r)

  seen = []
  run(key, cfg, data3, checkpoint_dir=ckpt, on_round_end=held)
  assert seen == [1] and (ckpt / fedmd.CHECKPOINT_NAME).is_file()
  with _files.claimed_dir("checkpoint_dir", ckpt):  # and is freed after it
    pass
  # A run refused before training leaves no folder it created behind.
  with pytest.raises(ValueError, match="on_round_end"):
    run(key, cfg, data3, checkpoint_dir=tmp_path / "new" / "c", on_round_end=3)
  assert not (tmp_path / "new").exists()


def samples_equal(a, b):
  return all(np.array_equal(u, v) for da, db in zip(a.samples, b.samples) for u, v in zip(da, db))


def test_secret_seed_draws_the_samples_and_the_noise(data3):
  # The secret seed replaces the key of the two draws the privacy rests on (NFDP's samples, LDP's noise).
  key, secret = jax.random.key(5), 2**40 + 7
  cfg = tiny_config(rounds=1)
  public = run(key, cfg, data3)
  hidden = run(key, cfg, data3, secret_seed=secret)
  # 3 parties x C(24, 4) = 10,626 samples each: equal samples by chance have probability ~1e-12.
  assert not samples_equal(public, hidden)
  assert samples_equal(hidden, run(key, cfg, data3, secret_seed=secret))  # a pure function of the seed
  assert not samples_equal(hidden, run(key, cfg, data3, secret_seed=7))  # all 64 bits enter the key
  for rep in hidden.privacy:
    assert rep["randomness"].startswith("secret seed")
    assert "randomness_from_run_key" not in {w["code"] for w in rep["warnings"]}
  assert public.privacy[0]["randomness"].startswith("run key")
  assert "randomness_from_run_key" in {w["code"] for w in public.privacy[0]["warnings"]}
  assert str(secret) not in json.dumps(hidden.to_report(), default=str)
  # A method without private randomness ignores it: bitwise the same run.
  np_cfg = tiny_config(method="np", rounds=1)
  assert_bitwise_equal(run(key, np_cfg, data3, record_releases=True),
                       run(key, np_cfg, data3, record_releases=True, secret_seed=secret))
  # LDP: the secret seed changes the noise alone. Up to round 1's releases the np and ldp runs train the
  # same models with the same keys, so ldp - np is the noise: N(0, sigma^2) from the secret key, not the
  # public one. The mean of z^2 over 3 x 24 x 16 = 1,152 entries has sd 0.042: the bounds are 7 sd wide.
  ldp_cfg = tiny_config(method="ldp", rounds=1, ldp_epsilon=2.0, relation="replace-one")  # default delta: p(n_i)
  clean = run(key, np_cfg, data3, record_releases=True).releases[0].astype(np.float64)
  noises = []
  for seed in (None, secret):
    res = run(key, ldp_cfg, data3, record_releases=True, secret_seed=seed)
    sigma = np.array([p["sigma"] for p in res.privacy])[:, None, None]
    noises.append((res.releases[0] - clean) / sigma)
    assert 0.7 < np.mean(noises[-1] ** 2) < 1.3
  assert abs(np.corrcoef(noises[0].ravel(), noises[1].ravel())[0, 1]) < 0.15  # 5 sd of an independent pair


def test_one_secret_seed_at_two_ldp_budgets_draws_independent_noise(data3):
  # The same secret seed at ldp_epsilon 2 and 4 used to add one Gaussian draw at two sigmas, so that
  # (s1 r2 - s2 r1) / (s1 - s2) gave back the exact clipped logits. The noise key now folds in a digest of the
  # configuration, key and data. Up to round 1's releases np and ldp train the same models with the same keys.
  key, secret = jax.random.key(5), 2**40 + 7
  clean = run(key, tiny_config(method="np", rounds=1), data3, record_releases=True).releases[0].astype(np.float64)
  noises = []
  for eps in (2.0, 4.0):
    res = run(key, tiny_config(method="ldp", rounds=1, ldp_epsilon=eps, relation="replace-one"), data3,
              record_releases=True, secret_seed=secret)
    sigma = np.array([p["sigma"] for p in res.privacy])[:, None, None]
    noises.append((res.releases[0] - clean) / sigma)
  # A shared draw gives correlation 1 (up to float32 rounding); independent ones, |r| < 0.15 (5 sd of 1,152 pairs).
  assert abs(np.corrcoef(noises[0].ravel(), noises[1].ravel())[0, 1]) < 0.15
  # The same run again draws the same noise: a resume, or a repeat, reveals nothing new.
  again = run(key, tiny_config(method="ldp", rounds=1, ldp_epsilon=4.0, relation="replace-one"), data3,
              record_releases=True, secret_seed=secret)
  assert np.array_equal(again.releases[0], res.releases[0])


@pytest.mark.parametrize("secret_seed", [None, 2**40 + 7])
def test_samples_for_smaller_k_are_prefixes_of_larger_k(data3, secret_seed):
  # What the CLI's runs_share_parties warning says of runs from one key: paired, not independent.
  key, out = jax.random.key(3), {}
  for wr in (False, True):
    for k in (3, 16):
      cfg = tiny_config(k=k, with_replacement=wr, rounds=0, pretrain_epochs=0, init_epochs=0)
      res = run(key, cfg, data3, secret_seed=secret_seed)
      out[wr, k] = res.samples
      # With no rounds nothing but the final model leaves a party (the report said "predictions every round").
      assert res.privacy[0]["released"] == "the final model (no rounds, so no public-set predictions)"
  for wr in (False, True):
    for small, large in zip(out[wr, 3], out[wr, 16]):
      np.testing.assert_array_equal(small[0], large[0][:3])


def test_resume_keeps_the_secret_seed(data3, tmp_path):
  cfg = tiny_config(rounds=3, resample_each_round=True)  # a fresh sample every round, all from the secret
  key, secret = jax.random.key(5), 123456789012
  full = run(key, cfg, data3, checkpoint_dir=tmp_path / "a", record_releases=True, secret_seed=secret)

  def stop(r, info):
    if r == 1:
      raise Interrupt()

  with pytest.raises(Interrupt):
    run(key, cfg, data3, checkpoint_dir=tmp_path / "b", record_releases=True, on_round_end=stop,
        secret_seed=secret)
  assert fedmd.checkpoint_secret_seed(tmp_path / "b") == secret
  # Owner-only: the file names the sampled records and now holds the secret.
  assert (tmp_path / "b" / fedmd.CHECKPOINT_NAME).stat().st_mode & 0o777 == 0o600
  assert fedmd.checkpoint_secret_seed(tmp_path / "none-here") is None
  for other, needle in ((None, "passes none"), (secret + 1, "another one")):
    with pytest.raises(ValueError, match=needle) as err:
      run(key, cfg, data3, checkpoint_dir=tmp_path / "b", resume=True, secret_seed=other)
    assert str(secret) not in str(err.value)
  resumed = run(key, cfg, data3, checkpoint_dir=tmp_path / "b", resume=True, record_releases=True,
                secret_seed=fedmd.checkpoint_secret_seed(tmp_path / "b"))
  assert resumed.resumed_from == 1
  assert_bitwise_equal(full, resumed)
  assert samples_equal(full, resumed) and [len(d) for d in resumed.samples] == [3, 3, 3]
  # A checkpoint made without a secret seed is not continued with one.
  one = dataclasses.replace(cfg, rounds=1)
  run(key, one, data3, checkpoint_dir=tmp_path / "c")
  with pytest.raises(ValueError, match="made with no secret_seed"):
    run(key, one, data3, checkpoint_dir=tmp_path / "c", resume=True, secret_seed=secret)


@pytest.mark.parametrize("method", ["nfdp", "ldp"])
def test_a_run_interrupted_after_round_1_released_releases_it_again_bit_for_bit(data3, tmp_path, monkeypatch,
                                                                               method):
  # Round 1's consensus goes out before the round's checkpoint (digest, revisit and evaluation come between). The
  # first checkpoint used to be round 1's, so a run stopped there left none: a re-run drew a fresh secret seed
  # (the CLI's --secret-randomness), hence a second sample or noise draw for round 1, and its report claimed one.
  extra = dict(ldp_epsilon=2.0, relation="replace-one") if method == "ldp" else {}
  cfg = tiny_config(method=method, rounds=2, **extra)
  key, secret = jax.random.key(5), 2**50 + 3
  full = run(key, cfg, data3, checkpoint_dir=tmp_path / "a", record_releases=True, secret_seed=secret)
  fit = fedmd._runner._fit_group  # pylint: disable=protected-access
  released = []

  def interrupted(*a, **kw):
    if kw["when"] == "in round 1's digest":
      released.append(np.asarray(a[3]))  # the consensus the digest trains on: it has left the parties
      raise Interrupt()
    return fit(*a, **kw)

  monkeypatch.setattr(fedmd._runner, "_fit_group", interrupted)  # pylint: disable=protected-access
  with pytest.raises(Interrupt):
    run(key, cfg, data3, checkpoint_dir=tmp_path / "b", record_releases=True, secret_seed=secret)
  monkeypatch.setattr(fedmd._runner, "_fit_group", fit)  # pylint: disable=protected-access
  np.testing.assert_array_equal(released[0], full.consensus[0])
  # The checkpoint written before the release holds the secret seed: a re-run cannot start afresh, nor resume
  # with another seed (the CLI's --resume reads this one back).
  assert fedmd.checkpoint_secret_seed(tmp_path / "b") == secret
  with pytest.raises(ValueError, match="exists: pass resume=True"):
    run(key, cfg, data3, checkpoint_dir=tmp_path / "b", secret_seed=secret)
  with pytest.raises(ValueError, match="another one"):
    run(key, cfg, data3, checkpoint_dir=tmp_path / "b", resume=True, secret_seed=secret + 1)
  resumed = run(key, cfg, data3, checkpoint_dir=tmp_path / "b", resume=True, record_releases=True,
                secret_seed=secret)
  assert resumed.resumed_from == 0
  assert_bitwise_equal(full, resumed)  # round 1 released again, the same bits: nothing new left the parties
  assert samples_equal(full, resumed)
  assert [len(d) for d in resumed.samples] == ([1, 1, 1] if method == "nfdp" else [0, 0, 0])
  assert resumed.privacy == full.privacy


@pytest.mark.parametrize("content", [b"PK\x03\x04truncated", b"not a zip at all", "npz-without-meta"])
def test_a_damaged_checkpoint_is_a_one_line_error(data3, tmp_path, content):
  path = tmp_path / fedmd.CHECKPOINT_NAME
  if content == "npz-without-meta":
    np.savez(path, accuracy=np.zeros(3))
  else:
    path.write_bytes(content)
  with pytest.raises(ValueError, match="cannot be read") as err:
    fedmd.checkpoint_secret_seed(tmp_path)
  assert "\n" not in str(err.value)
  with pytest.raises(ValueError, match="cannot be read"):
    run(jax.random.key(0), tiny_config(rounds=1, pretrain_epochs=0, init_epochs=1), data3,
        checkpoint_dir=tmp_path, resume=True)


def test_checkpoint_guards(data3, tmp_path):
  cfg = tiny_config(rounds=1, pretrain_epochs=0, init_epochs=1)
  key = jax.random.key(0)
  run(key, cfg, data3, checkpoint_dir=tmp_path)
  with pytest.raises(ValueError, match="resume"):
    run(key, cfg, data3, checkpoint_dir=tmp_path)  # would release everything again
  with pytest.raises(ValueError, match="different run"):
    run(jax.random.key(1), cfg, data3, checkpoint_dir=tmp_path, resume=True)
  with pytest.raises(ValueError, match="different run"):
    run(key, dataclasses.replace(cfg, k=5), data3, checkpoint_dir=tmp_path, resume=True)
  assert not list(tmp_path.glob("*.tmp"))
  with pytest.raises(ValueError, match="checkpoint_dir=.* to be a folder; it is a file"):
    run(key, cfg, data3, checkpoint_dir=tmp_path / "fedmd_checkpoint.npz")  # checked before any training


def test_vmapped_parties_equal_the_loop(data3):
  # Three parties of one architecture: one vmapped batch versus one at a time. Adam amplifies
  # float-rounding differences in near-zero gradients to ~lr per step (see
  # tests/models/test_training.py), so the check is on predictions, with a tolerance.
  # Softmax releases: argmax one-hots flip on near-ties (6 of 2,304 entries on an AVX-512 CPU), and a
  # flipped vote then steers the next round's training. Measured there: releases within 6.7e-5, parameters
  # within 1.1e-3.
  spec = (CNNSpec((2, 4), 0.2),)
  on = run(jax.random.key(2), tiny_config(specs=spec, vmap="on", learning_rate=1e-4, aggregation="softmax"),
           data3, record_releases=True)
  off = run(jax.random.key(2), tiny_config(specs=spec, vmap="off", learning_rate=1e-4, aggregation="softmax"),
            data3, record_releases=True)
  assert on.timings["vmap"] and not off.timings["vmap"]
  assert len(on.groups) == 1 and on.groups[0][1] == [0, 1, 2]
  np.testing.assert_allclose(on.releases, off.releases, atol=1e-2)
  for u, v in zip(leaves(on), leaves(off)):
    np.testing.assert_allclose(u, v, atol=2e-3, rtol=1e-3)


def test_privacy_report_per_party(data3):
  res = run(jax.random.key(0), tiny_config(rounds=2), data3, ldp_table_epsilons=(0.0, 1.0))
  n = data3.party_sizes[0]
  rep = res.privacy[0]
  assert rep["paper"]["delta"] == pytest.approx(4 / n)
  assert rep["exact"]["delta_for_every_epsilon"] == pytest.approx(4 / n)
  assert rep["records_exposed"] == pytest.approx(4)
  assert rep["sample"] == "drawn once, reused" and rep["draws"] == 1
  # The shareable report names no sampled record (the indices live only in the checkpoint).
  report = json.loads(json.dumps(res.to_report()))
  assert "samples" not in report and "samples" not in report["privacy"][0]
  assert report["privacy"][0]["draws"] == 1
  # argmax releases need no clip: the report records none (it recorded the default 10, never read).
  assert report["config"]["ldp_clip"] is None and report["config"]["k"] == 4
  codes = {w["code"] for w in rep["warnings"]}
  assert {"delta_at_least_1_over_n", "paper_epsilon_vacuous", "randomness_from_run_key"} <= codes
  table = res.ldp_sigma_table
  assert table["delta"] == pytest.approx(4 / n) and table["count"] == 24 * 2
  assert [r["epsilon"] for r in table["rows"]] == [0.0, 1.0]
  assert table["rows"][0]["sigma"] > table["rows"][1]["sigma"]
  fresh = run(jax.random.key(0), tiny_config(rounds=2, resample_each_round=True,
                                                         with_replacement=True), data3)
  rep = fresh.privacy[0]
  p = 1 - (1 - 1 / n)**4
  assert rep["exact"]["delta_for_every_epsilon"] == pytest.approx(1 - (1 - p)**2)
  assert rep["sample"] == "resampled each round" and rep["draws"] == 2
  assert "resampled_each_round" in {w["code"] for w in rep["warnings"]}
  # The LDP table is matched to this run's delta, not to one draw's p (which overstated LDP's sigma).
  assert fresh.ldp_sigma_table["delta"] == pytest.approx(1 - (1 - p)**2)
  assert "1 - (1 - p)^2" in fresh.ldp_sigma_table["matched_to"]


def test_ldp_table_and_cli_summary_use_the_largest_party_delta():
  # With unequal parties the run's NFDP guarantee is the smallest party's delta k/n_i; the LDP table was matched
  # to party 0's, and the CLI printed party 0's alone ("party-0 delta").
  from jaxdistill.cli._fedmd import _largest_delta  # pylint: disable=import-outside-toplevel
  data = tiny_data(num_parties=3, partition="dirichlet")
  sizes = list(data.party_sizes)
  assert len(set(sizes)) > 1 and min(sizes) >= 4
  worst = int(np.argmin(sizes))
  res = run(jax.random.key(0), tiny_config(rounds=1, init_epochs=1), data, ldp_table_epsilons=(1.0,))
  deltas = [p["exact"]["delta_for_every_epsilon"] for p in res.privacy]
  assert deltas == pytest.approx([4 / n for n in sizes])
  assert res.ldp_sigma_table["delta"] == pytest.approx(4 / min(sizes)) == pytest.approx(max(deltas))
  assert f"party {worst}'s" in res.ldp_sigma_table["matched_to"]
  assert _largest_delta(res.privacy) == f"{4 / min(sizes):.4g} ({worst})"
  assert _largest_delta([{}, {"calibrated_to": {"delta": 1e-5}}]) == "1e-05 (1)" and _largest_delta([{}]) == "-"


def test_ldp_over_several_rounds_and_with_logits_releases(data3):
  # Every LDP run in the tests had R = 1 and argmax releases, so sigma calibrated for Q releases instead of
  # Q x R, and logits clipped at twice the norm the noise assumes, both passed.
  key, target = jax.random.key(3), 4 / data3.party_sizes[0]
  res = run(key, tiny_config(method="ldp", rounds=2, ldp_epsilon=2.0, ldp_delta=target), data3)
  sigma = res.privacy[0]["sigma"]
  assert res.privacy[0]["count"] == 24 * 2
  # Balle & Wang 2018, Thm 8, by hand: the T = Q x R = 48 argmax releases (sensitivity sqrt 2) are (2, delta)-DP
  # at this sigma, and 1% less noise is not.
  assert delta_by_hand(2.0, sigma, 2**0.5, 48) <= target * (1 + 1e-6)
  assert delta_by_hand(2.0, 0.99 * sigma, 2**0.5, 48) > target
  # Logits releases: rows clipped to L2 norm `clip` before the noise. Round 1's release is the np run's logits
  # (same models, data and keys up to then) clipped by hand, plus N(0, sigma^2) noise: chi-square test of
  # sum z^2 over 3 x 24 x 16 entries, two-sided at 1e-3, and a 4-sd test of the mean (false-failure rate about
  # 1e-3; the key is fixed). Clipping at 2 x clip shifts most rows (norms 2-9 x clip here) by about clip,
  # a few sigma, which the chi-square rejects.
  clip = 0.02
  kw = dict(rounds=2, aggregation="logits", ldp_clip=clip)
  raw = run(key, tiny_config(method="np", rounds=2, aggregation="logits"), data3,  # np takes no clip
            record_releases=True).releases[0].astype(np.float64)
  ldp = run(key, tiny_config(method="ldp", ldp_epsilon=400.0, ldp_delta=target, **kw), data3,
            record_releases=True)
  norms = np.linalg.norm(raw, axis=-1, keepdims=True)
  assert np.mean(norms > 2 * clip) > 0.5
  by_hand = raw * np.minimum(1.0, clip / norms)
  sigmas = np.array([p["sigma"] for p in ldp.privacy])[:, None, None]
  z = (ldp.releases[0].astype(np.float64) - by_hand) / sigmas
  assert 5e-4 < stats.chi2.sf(np.sum(z**2), z.size) < 1 - 5e-4
  assert abs(z.mean()) < 4 / np.sqrt(z.size)
  # The sigma of that run: 48 releases of sensitivity 2 clip (the diameter of the clipped rows).
  assert delta_by_hand(400.0, ldp.privacy[0]["sigma"], 2 * clip, 48) <= target * (1 + 1e-6)
  assert delta_by_hand(400.0, 0.99 * ldp.privacy[0]["sigma"], 2 * clip, 48) > target


def test_baselines_run_and_report(data3):
  key = jax.random.key(3)
  out = {}
  for method in ("np", "ldp", "local", "local-sample", "centralized"):
    ldp = dict(ldp_epsilon=2.0, ldp_delta=4 / data3.party_sizes[0]) if method == "ldp" else {}
    cfg = tiny_config(method=method, rounds=1, **ldp)
    out[method] = run(key, cfg, data3, record_releases=True)
    acc = out[method].accuracy
    assert acc.shape == (2, 3) and np.all((acc >= 0) & (acc <= 1))
    # Restricting the argmax to the private classes can only fix mistakes, never add them.
    assert np.all(out[method].accuracy_private >= acc)
  assert out["np"].privacy[0]["guarantee"] == "none" and "warnings" not in out["np"].privacy[0]
  ldp = out["ldp"].privacy[0]
  # The float32 noise and the key's public seed are disclosed beside the Gaussian's (eps, delta), and so
  # is the target delta 4/n (NFDP's p) >= 1/n.
  assert {w["code"] for w in ldp["warnings"]} == {"float_gaussian_output", "delta_at_least_1_over_n",
                                                  "randomness_from_run_key"}
  assert "subtract it" in [w for w in ldp["warnings"] if w["code"] == "randomness_from_run_key"][0]["message"]
  assert ldp["mechanism"] == "gaussian" and ldp["count"] == 24
  assert ldp["calibrated_to"]["delta"] == pytest.approx(4 / data3.party_sizes[0])
  assert ldp["epsilon_at_target_delta"] <= 2.0 * (1 + 1e-6)
  assert ldp["sigma"] == pytest.approx(fedmd.calibrate_ldp_sigma(2.0, 4 / data3.party_sizes[0],
                                                                 sensitivity=2**0.5, count=24))
  # Independently of the library (Balle & Wang 2018, Thm 8 written out by hand): the sigma makes the
  # T = Q x R = 24 x 1 argmax releases (2.0, 4/n)-DP, and 1% less noise would not (so T is the right count).
  target = 4 / data3.party_sizes[0]
  assert delta_by_hand(2.0, ldp["sigma"], 2**0.5, 24) <= target * (1 + 1e-6)
  assert delta_by_hand(2.0, 0.99 * ldp["sigma"], 2**0.5, 24) > target
  # The noise on the releases really is N(0, sigma^2): up to round 1's releases the np and ldp runs train
  # the same models on the same data with the same keys, so their round-1 releases differ by the noise
  # alone. Chi-square test of sum (noise / sigma)^2 over 3 x 24 x 16 entries, two-sided at 1e-3, plus a
  # 4-sd test of the mean (false-failure rate ~1e-3 in all with a fresh key; the key here is fixed).
  noise = out["ldp"].releases[0].astype(np.float64) - out["np"].releases[0]
  z = noise / np.array([p["sigma"] for p in out["ldp"].privacy])[:, None, None]
  dof = z.size
  tail = stats.chi2.sf(np.sum(z**2), dof)
  assert 5e-4 < tail < 1 - 5e-4
  assert abs(z.mean()) < 4 / np.sqrt(dof)
  # LDP's consensus is projected back onto the simplex (post-processing).
  np.testing.assert_allclose(out["ldp"].consensus.sum(-1), 1.0, rtol=1e-5)
  assert out["ldp"].consensus.min() >= 0
  # Without collaboration nothing is released.
  assert out["local"].consensus.shape[0] == 0 and out["centralized"].consensus.shape[0] == 0
  assert out["local-sample"].privacy[0]["released"] == "nothing but the final model"


def test_non_iid_partitions_and_weighting():
  data = tiny_data(num_parties=3, partition="classes")
  labels = [set(p.labels.tolist()) for p in data.parties]
  assert all(len(s) <= 3 for s in labels)  # 2 classes each, (a shared class split evenly)
  # Size weights make the broadcast consensus depend on n_i: under add/remove (where n_i is private) that revealed
  # an added record that was never sampled (consensus moved by 9e-4) while the report still said delta = k/n.
  for method in ("nfdp", "ldp"):
    with pytest.raises(ValueError, match=r"weighting='size'.*relation='replace-one'") as err:
      tiny_config(method=method, rounds=1, weighting="size", ldp_delta=1e-3)
    assert "\n" not in str(err.value)
  res = run(jax.random.key(0), tiny_config(rounds=1, weighting="size", relation="replace-one"), data)
  sizes = np.asarray(data.party_sizes, np.float64)
  assert res.privacy[0]["relation"] == "replace-one"
  assert "weights_depend_on_local_size" not in {w["code"] for w in res.privacy[0].get("warnings", [])}
  res_np = run(jax.random.key(0), tiny_config(method="np", rounds=1, weighting="size"), data, record_releases=True)
  np.testing.assert_allclose(res_np.consensus[0], np.tensordot(sizes / sizes.sum(), res_np.releases[0], 1),
                             rtol=1e-5, atol=1e-6)
  res = run(jax.random.key(0), tiny_config(rounds=1, weighting=(1.0, 0.0, 0.0)), data,
                        record_releases=True)
  np.testing.assert_allclose(res.consensus[0], res.releases[0, 0])  # only party 0 counts
  d = tiny_data(num_parties=3, partition="dirichlet")
  assert sum(d.party_sizes) == 6 * 12


@pytest.mark.parametrize("kw,needle", [
    (dict(k=1000), "k=1000"),
    (dict(num_parties=0), "num_parties"),
    (dict(aggregation="median"), "aggregation"),
    (dict(method="fedavg"), "method"),
    (dict(weighting=(1.0, 2.0)), "weights"),
    (dict(public_subset=10_000), "public_subset"),
    (dict(num_parties=4), "num_parties"),
    (dict(vmap="maybe"), "vmap"),
    (dict(method="np", resample_each_round=True), "resample_each_round"),
    # Training caps epochs at 10^6; the config did not, and digest_epochs = 10^6 + 1 failed after round 1's
    # consensus had been computed, naming "epochs".
    (dict(digest_epochs=10**6 + 1), "digest_epochs=1000001 <= 1000000"),
    (dict(pretrain_epochs=10**7), "pretrain_epochs"),
])
def test_bad_input_is_a_one_line_value_error(data3, kw, needle):
  with pytest.raises(ValueError, match=needle) as err:
    run(jax.random.key(0), tiny_config(**kw), data3)
  assert "\n" not in str(err.value)


def test_an_rbg_key_is_refused(data3):
  # The runner promises the same samples and batches vmapped or looped; rbg's draws change under vmap, so
  # vmapped parties trained on other batches than looped ones.
  with pytest.raises(ValueError, match=r"Expected key to be a threefry2x32 key.*got a rbg key") as err:
    run(jax.random.key(0, impl="rbg"), tiny_config(), data3)
  assert "\n" not in str(err.value)


@pytest.mark.parametrize("method", ["nfdp", "local"])
def test_diverged_training_names_the_learning_rate(data3, method):
  # Adam at 1e30 makes every party's weights NaN. Before, "local" scored the NaN models as predicting class 0
  # (a silent accuracy) and "nfdp" failed at its first release with "Expected finite logits". models.fit now
  # raises DivergedError, naming clf.tx; the runner names its own learning_rate instead.
  with pytest.raises(ValueError, match=r"The parties' training diverged in the pre-training on the public labels "
                                       r"\(NaN or inf parameters after 1 epoch\)\. Lower learning_rate "
                                       r"\(CLI: --lr; now 1e\+30\)") as err:
    diverging = tiny_config(method=method)
    object.__setattr__(diverging, "learning_rate", 1e30)  # past the constructor's cap (10): still named
    run(jax.random.key(0), diverging, data3)
  assert "\n" not in str(err.value)


def test_ldp_noise_beyond_float32_is_refused_before_training(data3, monkeypatch):
  def no_training(*args, **kwargs):
    raise AssertionError("trained before refusing the noise scale")
  monkeypatch.setattr(fedmd._runner, "_fit_group", no_training)  # pylint: disable=protected-access
  # Before: a RuntimeWarning (float32 overflow) and "Expected finite released" after training.
  with pytest.raises(ValueError, match=r"standard deviation of .* \(ldp_clip=1e\+38, ldp_epsilon=1\).*"
                                       r"lower ldp_clip or raise ldp_epsilon") as err:
    run(jax.random.key(0), tiny_config(method="ldp", aggregation="logits", ldp_clip=1e38, ldp_epsilon=1.0,
                                       ldp_delta=1e-5), data3)
  assert "\n" not in str(err.value)


def _rebuilt(data, **changes):
  fields = dict(public=data.public, parties=data.parties, test=data.test, num_classes=data.num_classes,
                num_public_classes=data.num_public_classes, description=data.description)
  fields.update(changes)
  return fedmd.FedMDData(**fields)


def test_hand_built_data_is_checked_before_training(data3):
  # Each of these passed check_config and trained: 20 public classes of 16 failed in numpy's argmax after
  # training, 0 scored the private-task accuracy as the full one, one party's smaller images failed in XLA after
  # party 0 had trained, and an empty test set failed after training.
  from jaxdistill.data import ImageData  # pylint: disable=import-outside-toplevel
  p1 = data3.parties[1]
  small = ImageData(p1.images[:, 1:-1, 1:-1], p1.labels, p1.num_classes, p1.name)
  empty = ImageData(data3.test.images[:0], data3.test.labels[:0], data3.test.num_classes, "empty")
  wrong_labels = ImageData(p1.images, np.zeros_like(p1.labels), p1.num_classes, p1.name)
  cases = [
      (_rebuilt(data3, num_public_classes=data3.num_classes + 4), "num_public_classes="),
      (_rebuilt(data3, num_public_classes=0), "num_public_classes=0 >= 1"),
      (_rebuilt(data3, parties=(data3.parties[0], small, data3.parties[2])), r"data.parties\[1\] images of shape"),
      (_rebuilt(data3, test=empty), "data.test to hold at least one image"),
      (_rebuilt(data3, parties=(data3.parties[0], wrong_labels, data3.parties[2])),
       r"data.parties\[1\] labels in \[10, "),
  ]
  for data, needle in cases:
    with pytest.raises(ValueError, match=needle) as err:
      fedmd.check_config(tiny_config(), data)
    assert "\n" not in str(err.value)
  fedmd.check_config(tiny_config(), data3)  # the loader's data passes


def test_unknown_partition_and_too_few_records():
  with pytest.raises(ValueError, match="partition"):
    tiny_data(partition="by-writer")
  with pytest.raises(ValueError, match="private_per_class"):
    tiny_data(per_class=10_000)


@pytest.mark.parametrize("kw,needle", [
    (dict(ldp_table_epsilons=5.0), "ldp_table_epsilons"),
    (dict(ldp_table_epsilons="0,1"), "ldp_table_epsilons"),
    (dict(ldp_table_epsilons=[0.0, -1.0]), r"ldp_table_epsilons=-1.0 >= 0"),
    (dict(ldp_table_epsilons=[float("nan")]), "ldp_table_epsilons"),
    (dict(ldp_table_epsilons=[float("inf")]), "ldp_table_epsilons"),
    (dict(ldp_table_epsilons=["1"]), "ldp_table_epsilons"),
    # Only nfdp and ldp reports have the table: NP's run ignored it without a word.
    (dict(config=dict(method="np"), ldp_table_epsilons=[1.0]),
     r"Expected no ldp_table_epsilons for method='np': only nfdp and ldp reports have the FedMD-LDP sigma table "
     r"\(elsewhere they are ignored\); got \(1.0,\)\."),
    # A run of no rounds releases no predictions and has no table: it was ignored.
    (dict(config=dict(rounds=0), ldp_table_epsilons=[1.0]),
     r"Expected no ldp_table_epsilons with rounds=0: the FedMD-LDP sigma table matches noise to the predictions "
     r"released in rounds, and a run of no rounds releases none \(they were ignored\); got \(1.0,\)\."),
    (dict(config=dict(ldp_delta=1e-3), ldp_table_epsilons=()),
     r"Expected ldp_table_epsilons other than \(\) for method='nfdp' with ldp_delta=0.001: there ldp_delta is the "
     r"sigma table's delta, and nothing else uses it\."),
    (dict(on_round_end=5), "on_round_end"),
    (dict(on_round_end="print"), "on_round_end"),
    (dict(secret_seed=-1), "secret_seed"),
    (dict(secret_seed=2**64), "secret_seed"),
    (dict(secret_seed=1.5), "secret_seed"),
    (dict(secret_seed="12345"), "secret_seed"),
    (dict(secret_seed=True), "secret_seed"),
])
def test_bad_table_epsilons_and_callback_fail_before_training(data3, monkeypatch, kw, needle):
  def no_training(*args, **kwargs):
    raise AssertionError("trained before validating the arguments")
  monkeypatch.setattr(fedmd._runner, "_fit_group", no_training)  # pylint: disable=protected-access
  kw = dict(kw)
  with pytest.raises(ValueError, match=needle) as err:
    fedmd.run_fedmd(jax.random.key(0), tiny_config(**kw.pop("config", {})), data3, **kw)
  assert "\n" not in str(err.value)
  if "secret_seed" in kw:  # a mistyped secret is still a secret: the message never echoes it
    assert str(kw["secret_seed"]) not in str(err.value)


def test_ldp_noise_is_float32_and_the_same_with_x64_on():
  # The noise took jax.random.normal's default dtype: float64 with x64 on, which drew other noise for the same
  # key and turned the releases into float64. It is float32 now, x64 on or off, and party i's noise is
  # sigma_i times the standard normal drawn from fold_in(noise_key, i).
  from jaxdistill.fedmd import _runner  # pylint: disable=import-outside-toplevel
  rel = jnp.asarray(np.random.default_rng(0).random((3, 5, 4)), jnp.float32)
  sigmas, key = [0.5, 1.0, 2.0], jax.random.key(1)
  want = np.asarray(_runner._ldp_noised(key, rel, sigmas))
  with jax.enable_x64(True):
    got = np.asarray(_runner._ldp_noised(key, rel, sigmas))
  assert got.dtype == want.dtype == np.float32
  np.testing.assert_array_equal(got, want)
  for i, sigma in enumerate(sigmas):
    z = np.asarray(jax.random.normal(jax.random.fold_in(key, i), (5, 4)))
    np.testing.assert_allclose(want[i], np.asarray(rel[i]) + sigma * z, rtol=1e-6, atol=1e-6)
