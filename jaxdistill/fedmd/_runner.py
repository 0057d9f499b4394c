"""FedMD-NFDP (Algorithm 1) and its baselines in one runner, with checkpoints.

Algorithm 1 (Sun & Lyu 2021), for parties i = 1..N with private D_i:

.. code-block:: text

   f_i <- init (optionally pre-trained on the public labels)
   S_i <- k records of D_i, drawn ONCE (WR or WOR)      # the only access to D_i
   train f_i on S_i for T1 epochs
   for r = 1..R:
     P_r   <- fresh random public subset (|P_r| = public_subset)
     Y_i   <- g(f_i(P_r))             g in {argmax one-hot, softmax, logits}
     Ybar  <- sum_i w_i Y_i / sum_i w_i                    # server
     Digest : train f_i on (P_r, Ybar) for T2 epochs
     Revisit: train f_i on S_i for T3 epochs

Baselines run through the same loop with a different *private view* and
collaboration switch: FedMD-NP and FedMD-LDP see all of D_i (LDP adds
Gaussian noise to every release), local-only skips Digest, centralized
trains every architecture on the pooled private data.

Data access: in ``nfdp`` and ``local-sample`` the runner holds each party's
records only inside a :class:`~jaxdistill.fedmd.SampleOracle`; the sample it
returns is the only private data any training step sees, and the privacy
report is computed from the oracle's recorded draws.

Randomness: every phase key is ``fold_in(fold_in(root, phase), round)`` and
each party gets ``fold_in(., party)``, so a run is a pure function of the
root key, the configuration and the data, and an interrupted and resumed
run equals an uninterrupted one. Every party draws the same sample and the
same batches whether same-architecture parties are vmapped or looped, but
the two compile to different float32 kernels, whose rounding Adam amplifies
over epochs: accuracies and releases agree only statistically. ``vmap="auto"``
loops on CPU and vmaps on GPU/TPU, so set ``vmap`` explicitly to compare
numbers across backends; the report records the mode used
(``timings_s.vmap``).

Secret randomness: with ``secret_seed`` the two draws the privacy rests on,
NFDP's samples and FedMD-LDP's noise, come from that seed's key instead of
the root key; initialisation, batches and public subsets still come from the
root key. Whoever knows the root key (the CLI records ``--seed``) can then
recompute neither which records were sampled nor the noise. The noise key
also folds in a digest of the configuration, root key and data, so a secret
seed reused for another sigma or other data draws independent noise (a
shared draw would let two releases cancel it).

Checkpoints: after the initial training (before round 1 releases anything)
and after every round, one ``.npz`` file (written atomically) holds the
model states, the samples drawn, the public subsets and consensus released
so far, the accuracy history, the round number, the root key, the secret
seed, if any, the configuration, and sha256 hashes of the public, private
and test data (the file names the sampled records, so it is private anyway;
the report holds none of this). ``resume=True`` continues from it without
drawing a new sample; a round interrupted after its release is released
again bit for bit (the same states, samples and keys), so nothing new leaves
the parties. It refuses a checkpoint made with other settings, data, key,
secret seed, ``record_releases``, vmap mode or x64 mode, naming what
differs.

References:
  Sun & Lyu, "Federated Model Distillation with Noise-Free Differential
  Privacy", IJCAI 2021, Algorithm 1. https://arxiv.org/abs/2009.05537
  Li & Wang, "FedMD", 2019. https://arxiv.org/abs/1910.03581
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import pathlib
import time
import zipfile
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxdistill import _keys
from jaxdistill._files import claimed_dir
from jaxdistill import _validate
from jaxdistill import accounting
from jaxdistill import models as M
from jaxdistill.data import ImageData
from jaxdistill.fedmd._aggregation import (aggregate, clip_rows, project_to_simplex, release,
                                           release_sensitivity)
from jaxdistill.fedmd._config import FedMDConfig
from jaxdistill.fedmd._data import FedMDData
from jaxdistill.fedmd._privacy import (DEFAULT_LDP_EPSILONS, calibrate_ldp_sigma, check_ldp_epsilon,
                                       ldp_sigma_table)
from jaxdistill.fedmd._sampling import NfdpSampler, SampleOracle, check_sampling_size

__all__ = ["FedMDResult", "check_config", "run_fedmd", "checkpoint_secret_seed", "CHECKPOINT_NAME"]

CHECKPOINT_NAME = "fedmd_checkpoint.npz"

# Phase tags for fold_in.
_INIT, _PRETRAIN, _SAMPLE, _TRAIN1, _PUBLIC, _NOISE, _DIGEST, _REVISIT = range(8)
#: NFDP deltas p from here up make no FedMD-LDP sigma: neither the run's default ldp_delta nor a side-table row
#: (eps > 0). Such a delta is no guarantee (one in two runs may publish a record verbatim).
_NO_GUARANTEE_DELTA = 0.5


def _phase(root: jax.Array, tag: int, r: int = 0) -> jax.Array:
  return jax.random.fold_in(jax.random.fold_in(root, tag), r)


def _ldp_noised(noise_key: jax.Array, rel: jax.Array, sigmas: list[float]) -> jax.Array:
  """FedMD-LDP's releases: party i's ``rel[i] + sigma_i N(0, I)``, its noise from ``fold_in(noise_key, i)``.

  The noise is drawn in float32 (rel's dtype) whether or not x64 is on: its default dtype would be float64 with
  x64 on, another draw for the same key.
  """
  return jnp.stack([rel[i] + sigmas[i] * jax.random.normal(jax.random.fold_in(noise_key, i), rel.shape[1:],
                                                           jnp.float32) for i in range(len(sigmas))])


def _party_keys(key: jax.Array, parties: list[int]) -> jax.Array:
  return jnp.stack([jax.random.fold_in(key, i) for i in parties])


@dataclasses.dataclass
class _Group:
  """Parties sharing one architecture; ``state`` is stacked over ``parties``."""

  spec: M.CNNSpec
  parties: list[int]
  clf: M.Classifier
  state: M.TrainState


@dataclasses.dataclass
class FedMDResult:
  """Outcome of :func:`run_fedmd`.

  Attributes:
    config: the run's configuration.
    accuracy: ``[E, N] float64`` test accuracy of each party after each
      evaluated round (row 0: before collaboration), argmax over all C
      outputs as in FedMD.
    accuracy_private: the same with the argmax restricted to the private
      task's classes (a 6-way task instead of 16-way).
    eval_rounds: the round number of each row of ``accuracy``.
    privacy: per-party privacy report dicts.
    ldp_sigma_table: sigma FedMD-LDP needs at the run's NFDP delta, the
      largest over the parties (the smallest party's) for the run's
      schedule (p, or 1 - (1 - p)^R when resampled each round), or at
      ``config.ldp_delta`` when set (``matched_to`` says which), for several
      eps (nfdp and ldp runs).
    timings: seconds per phase, summed over every session of a resumed
      run; ``total_this_session``; ``earlier_sessions`` (the sessions
      before, up to their last checkpoint) and ``total_all_sessions``, the
      two added, which bounds the phases' sum; and ``vmap``: whether
      same-architecture parties were trained as one vmapped stack
      (``config.vmap`` resolved).
    samples: per party, the list of sample index arrays drawn (nfdp /
      local-sample). Resume restores them from the checkpoint; they are
      not written to :meth:`to_report` (which is shared more widely than
      the checkpoints, though it is no DP release either), since they name
      exactly the private records that are exposed.
    public_subsets: ``[R, q] int`` public indices queried per round.
    consensus: ``[R, q, C] float32`` consensus broadcast per round.
    releases: ``[R, N, q, C]`` per-party releases (only if requested).
    groups: final models, as ``(spec, parties, classifier, stacked state)``.
    resumed_from: round a resumed run started after (None: fresh run).
    data_description: where the data came from and the split sizes.
  """

  config: FedMDConfig
  data_description: dict
  accuracy: np.ndarray
  accuracy_private: np.ndarray
  eval_rounds: list[int]
  privacy: list[dict]
  ldp_sigma_table: dict | None
  timings: dict
  samples: list[list[np.ndarray]]
  public_subsets: np.ndarray
  consensus: np.ndarray
  releases: np.ndarray | None
  groups: list[tuple[M.CNNSpec, list[int], M.Classifier, M.TrainState]]
  resumed_from: int | None = None

  @property
  def final_accuracy(self) -> np.ndarray:
    """``[N]`` test accuracy of each party's final model."""
    return self.accuracy[-1]

  def party_state(self, party: int) -> tuple[M.Classifier, M.TrainState]:
    """The final (classifier, unstacked state) of ``party``."""
    for _, parties, clf, state in self.groups:
      if party in parties:
        return clf, M.unstack_state(state, parties.index(party))
    raise ValueError(f"Expected a party index in [0, {self.config.num_parties}); got {party}.")

  def to_report(self) -> dict:
    """A JSON-ready summary (no arrays of data, and no sampled record indices).

    The experimenter's record, not a DP release: it holds every party's
    exact size (``data.party_sizes``; n, 1/n and the paper's epsilon in
    ``privacy``, and under the default add/remove relation n is itself
    private) and accuracies of models trained on private data. The privacy
    statements cover only what the parties release in the run (the
    per-round releases and, for ``nfdp``, the final models), not this
    report.
    """
    acc = self.accuracy
    return {
        # null where the method does not read a setting (a local run recorded k 16, a sample it never drew).
        "config": {**self.config.to_dict(), **dict.fromkeys(self.config.unread_settings())},
        "data": self.data_description,
        "architectures": [{"party": i, "spec": s.name}
                          for s, ps, _, _ in self.groups for i in ps],
        "accuracy": {
            "eval_rounds": list(self.eval_rounds),
            "per_round_per_party": acc.tolist(),
            "per_round_mean": acc.mean(axis=1).tolist(),
            "final_per_party": acc[-1].tolist(),
            "final_mean": float(acc[-1].mean()),
            "final_min": float(acc[-1].min()),
            "final_max": float(acc[-1].max()),
            "private_classes_only": {
                "per_round_per_party": self.accuracy_private.tolist(),
                "final_per_party": self.accuracy_private[-1].tolist(),
                "final_mean": float(self.accuracy_private[-1].mean()),
            },
        },
        "privacy": self.privacy,
        "ldp_sigma_table": self.ldp_sigma_table,
        "timings_s": self.timings,
        "resumed_from_round": self.resumed_from,
    }


# -- party-wise training over groups ---------------------------------------------------

_CLASSIFIERS: dict[tuple, M.Classifier] = {}
_PRETRAINED: dict[tuple, M.TrainState] = {}
_PRETRAINED_MAX = 64


def _content_hash(d: ImageData) -> str:
  """sha256 of an image set's pixels and labels, with their shapes and dtypes (the same bytes as 28x28 or 14x56
  images, or as float32 pixels or int32 labels, are different data)."""
  h = hashlib.sha256()
  h.update(repr([(a.shape, np.asarray(a).dtype.str) for a in (d.images, d.labels)]).encode())
  h.update(np.ascontiguousarray(d.images).tobytes())
  h.update(np.ascontiguousarray(d.labels).tobytes())
  return h.hexdigest()


def _classifier(model: M.FedMDCNN, lr: float) -> M.Classifier:
  """One Classifier per architecture and step size, reused across runs so that
  jitted steps compile once per process (sweeps run many configurations).

  ``model`` is any instance of the architecture: only its graph definition is
  kept (parameter values live in each party's state)."""
  k = (model.spec, model.num_classes, model.input_shape, lr)
  if k not in _CLASSIFIERS:
    _CLASSIFIERS[k] = M.create(model, optax.adam(lr))[0]
  return _CLASSIFIERS[k]


def _use_vmap(config: FedMDConfig) -> bool:
  if config.vmap == "auto":
    return jax.default_backend() != "cpu"
  return config.vmap == "on"


def _fit_group(g: _Group, keys: jax.Array, images: Any, targets: Any, sizes: np.ndarray | None, *,
               epochs: int, batch_size: int, loss: str, shared: bool, vmap: bool, learning_rate: float,
               when: str) -> None:
  """Trains the group; a diverged training is a ValueError naming ``learning_rate`` (the CLI's --lr)."""
  try:
    _fit_group_unchecked(g, keys, images, targets, sizes, epochs=epochs, batch_size=batch_size, loss=loss,
                         shared=shared, vmap=vmap)
  except M.DivergedError as err:  # it names the optimiser of clf.tx, which run_fedmd built from learning_rate
    raise ValueError(f"The parties' training diverged {when} (NaN or inf parameters after {err.epochs} "
                     f"epoch{'s' * (err.epochs != 1)}). Lower learning_rate (CLI: --lr; now {learning_rate:g})."
                     ) from None


def _fit_group_unchecked(g: _Group, keys: jax.Array, images: Any, targets: Any, sizes: np.ndarray | None, *,
                         epochs: int, batch_size: int, loss: str, shared: bool, vmap: bool) -> None:
  if epochs == 0:
    return
  m = len(g.parties)
  if vmap and m > 1:
    g.state = M.fit_stacked(keys, g.clf, g.state, images, targets, epochs=epochs, batch_size=batch_size,
                            loss=loss, sizes=sizes, shared=shared)
    return
  out = []
  for j in range(m):
    x = images if shared else images[j]
    y = targets if shared else targets[j]
    size = None if sizes is None else int(sizes[j])
    out.append(M.fit(keys[j], g.clf, M.unstack_state(g.state, j), x, y, epochs=epochs,
                     batch_size=batch_size, loss=loss, size=size))
  g.state = M.stack_states(out)


def _predict_groups(groups: list[_Group], images: jax.Array, n_parties: int, vmap: bool) -> jax.Array:
  """``[N, q, C]`` eval-mode logits of every party on shared ``images``."""
  out: list[Any] = [None] * n_parties
  for g in groups:
    if vmap and len(g.parties) > 1:
      logits = M.predict_logits_stacked(g.clf, g.state, images)
      for j, i in enumerate(g.parties):
        out[i] = logits[j]
    else:
      for j, i in enumerate(g.parties):
        out[i] = M.predict_logits(g.clf, M.unstack_state(g.state, j), images)
  return jnp.stack(out)


def _stack_views(views: list[ImageData], parties: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Pads the parties' private views to one shape: images, labels, sizes."""
  sizes = np.array([len(views[i]) for i in parties])
  n = int(sizes.max())
  shape = views[parties[0]].images.shape[1:]
  images = np.zeros((len(parties), n) + shape, np.float32)
  labels = np.zeros((len(parties), n), np.int32)
  for j, i in enumerate(parties):
    images[j, :sizes[j]] = views[i].images
    labels[j, :sizes[j]] = views[i].labels
  return images, labels, sizes


def _train_private(groups: list[_Group], views: list[ImageData] | ImageData, key: jax.Array, *,
                   epochs: int, config: FedMDConfig, vmap: bool, when: str) -> None:
  """Every party trains on its private view (or all on one shared view)."""
  for g in groups:
    keys = _party_keys(key, g.parties)
    if isinstance(views, ImageData):
      _fit_group(g, keys, views.images, views.labels, None, epochs=epochs,
                 batch_size=config.private_batch_size, loss="cross_entropy", shared=True, vmap=vmap,
                 learning_rate=config.learning_rate, when=when)
    else:
      images, labels, sizes = _stack_views(views, g.parties)
      _fit_group(g, keys, images, labels, sizes, epochs=epochs, batch_size=config.private_batch_size,
                 loss="cross_entropy", shared=False, vmap=vmap, learning_rate=config.learning_rate, when=when)


def _check_trained(logits: Any, learning_rate: float, when: str) -> None:
  """Refuses NaN or inf logits (diverged training) with a message naming the step size.

  Without it argmax would score a NaN model as predicting class 0, and the release would
  fail later with a message that does not say why.
  """
  if not bool(jnp.all(jnp.isfinite(logits))):
    raise ValueError(f"The parties' logits {when} are NaN or inf: training diverged. Lower learning_rate "
                     f"(CLI: --lr; now {learning_rate:g}).")


def _evaluate(groups: list[_Group], test: ImageData, n_parties: int, vmap: bool,
              num_public: int, learning_rate: float, when: str) -> np.ndarray:
  """``[2, N]`` test accuracy: row 0 argmax over all C outputs (FedMD's metric), row 1
  argmax over the private task's classes only."""
  logits = np.asarray(_predict_groups(groups, jnp.asarray(test.images), n_parties, vmap))
  _check_trained(logits, learning_rate, f"on the test set {when}")
  full = np.mean(np.argmax(logits, -1) == test.labels[None, :], axis=1, dtype=np.float64)
  private = np.mean(np.argmax(logits[..., num_public:], -1) + num_public == test.labels[None, :], axis=1,
                    dtype=np.float64)
  return np.stack([full, private])


# -- checkpoints ----------------------------------------------------------------------


def _save_checkpoint(path: pathlib.Path, groups: list[_Group], meta: dict, arrays: dict) -> None:
  payload = {"meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)}
  for gi, g in enumerate(groups):
    for li, leaf in enumerate(jax.tree.leaves(g.state)):
      payload[f"g{gi}_{li}"] = np.asarray(leaf)
  payload.update(arrays)
  buf = io.BytesIO()
  np.savez(buf, **payload)
  tmp = path.with_suffix(".tmp")
  path.parent.mkdir(parents=True, exist_ok=True)
  # Owner-only (0600, as the labeling ledger's files): the checkpoint names the sampled records and may hold
  # the secret seed.
  with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
    f.write(buf.getvalue())
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def _read_checkpoint(path: pathlib.Path, *, meta_only: bool = False) -> tuple[dict, dict]:
  """(meta, arrays) of a checkpoint file; a damaged or foreign file is a one-line ValueError."""
  try:
    with np.load(path, allow_pickle=False) as z:
      files = {k: z[k] for k in (["meta"] if meta_only else z.files)}
    meta = json.loads(bytes(files.pop("meta")).decode())
    if not isinstance(meta, dict):
      raise ValueError("its metadata is not a JSON object")
  except (OSError, EOFError, KeyError, ValueError, UnicodeDecodeError, zipfile.BadZipFile) as err:
    raise ValueError(f"Checkpoint {path} cannot be read ({_validate.first_line(err)}); move it away to "
                     "start afresh.") from None
  return meta, files


def checkpoint_secret_seed(checkpoint_dir: Any) -> int | None:
  """The secret seed of the checkpoint in ``checkpoint_dir`` (None: no checkpoint, or a run without one).

  For resuming a run started with a fresh secret seed that nobody wrote
  down (the CLI's ``--secret-randomness``): the checkpoint holds it, beside
  the sampled records it protects, and never the report.
  """
  path = _validate.as_path("checkpoint_dir", checkpoint_dir) / CHECKPOINT_NAME
  if not path.is_file():
    return None
  return _read_checkpoint(path, meta_only=True)[0].get("secret_seed")


def _restore_states(path: pathlib.Path, groups: list[_Group], files: dict) -> None:
  """Sets every group's state from the checkpoint's arrays ``files`` (popped from it)."""
  for gi, g in enumerate(groups):
    leaves, treedef = jax.tree.flatten(g.state)
    new = []
    for li, leaf in enumerate(leaves):
      arr = files.pop(f"g{gi}_{li}", None)
      if arr is None or arr.shape != np.shape(leaf) or arr.dtype != np.asarray(leaf).dtype:
        raise ValueError(f"Checkpoint {path} does not match the models of this configuration.")
      new.append(jnp.asarray(arr))
    g.state = jax.tree.unflatten(treedef, new)


def _data_hashes(data: FedMDData) -> dict:
  """sha256 of every data set a run reads, to refuse resuming a checkpoint on other data.

  Written to the checkpoint only, never to the report: the checkpoint is the run's secret working state
  (owner-only; it names the sampled records and may hold the secret seed), so a hash of each party's
  private data may sit there, while report.json is meant to be shared. It reads every private record, but
  only to compare the run with its own checkpoint: nothing derived from it is released.
  """
  return {"public": _content_hash(data.public), "test": _content_hash(data.test),
          "parties": [_content_hash(p) for p in data.parties]}


def _secret_noise_root(secret_root: jax.Array, fingerprint: str, key_data: list, data: FedMDData,
                       hashes: dict | None) -> jax.Array:
  """FedMD-LDP's secret noise root: the secret seed's key folded with a digest of what the run releases.

  The digest covers the configuration (sigma and epsilon among it), the root key (training and public
  subsets) and the public and private data. One secret seed reused for a run that differs in any of them
  would otherwise add the SAME Gaussian draws to other logits: at two sigmas the two releases solve for the
  exact logits, and on two data sets their difference is the exact difference. With the digest such runs draw
  independent noise (they compose as separate releases); the same run again (a resume included) draws the
  same. NFDP's samples stay on the seed's own key: reusing a sample costs nothing more.
  """
  h = hashlib.sha256(json.dumps([fingerprint, key_data]).encode())
  hashes = hashes or {"public": _content_hash(data.public), "parties": [_content_hash(p) for p in data.parties]}
  for part in (hashes["public"], *hashes["parties"]):
    h.update(part.encode())
  return _keys.fold_in_digest(secret_root, h.digest())


def _short(value: Any) -> str:
  text = repr(value)
  return text if len(text) <= 60 else text[:57] + "..."


def _run_differences(meta: dict, config: FedMDConfig, description: dict, hashes: dict,
                     key_data: list) -> list[str]:
  """What differs between the run that wrote a checkpoint (``meta``) and this one, without any hash."""
  diffs = []
  old, new = meta.get("config"), json.loads(json.dumps(config.to_dict()))
  if isinstance(old, dict):
    diffs += [f"{name} {_short(old.get(name))} -> {_short(value)}" for name, value in new.items()
              if old.get(name) != value]
  if meta.get("key") != key_data:
    diffs.append("the key (CLI: --seed)")
  old, new = meta.get("data"), description
  if isinstance(old, dict):
    diffs += [f"data {name} {_short(old.get(name))} -> {_short(new.get(name))}"
              for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)]
  old = meta.get("data_hashes")
  if isinstance(old, dict):
    diffs += [f"the {part} data's content" for part in ("public", "test") if old.get(part) != hashes[part]]
    moved = [str(i) for i, h in enumerate(hashes["parties"])
             if not isinstance(old.get("parties"), list) or i >= len(old["parties"]) or old["parties"][i] != h]
    if moved:
      diffs.append(f"the private data of part{'ies' if len(moved) > 1 else 'y'} {', '.join(moved)}")
  return diffs


# -- the runner -----------------------------------------------------------------------


def check_config(config: FedMDConfig, data: FedMDData, *, checkpoint_dir: Any = None, resume: bool = False) -> None:
  """Raises the ``ValueError`` :func:`run_fedmd` would raise for ``config`` on ``data``, without training.

  Types of ``config`` and ``data``, party count, public subset, k against
  every party's size (sampling without replacement) or against the host's
  memory (with replacement: the N samples of k images must fit), whether
  the privacy of the schedule can be stated, FedMD-LDP's delta, and a
  checkpoint in ``checkpoint_dir`` without ``resume``. A sweep over several configurations (the CLI's
  ``--k 2,4,16``) checks them all before the first one trains.
  """
  _check_types(config, data)
  _check_data(data)
  resume = _validate.boolean("resume", resume)
  if isinstance(checkpoint_dir, (str, os.PathLike)) and str(checkpoint_dir) and not resume:  # others: run_fedmd
    ckpt = pathlib.Path(checkpoint_dir) / CHECKPOINT_NAME
    if ckpt.exists():
      raise ValueError(f"Checkpoint {ckpt} exists: pass resume=True (--resume) to continue it, or delete it "
                       "(a fresh run would release everything again).")
  if data.num_parties != config.num_parties:
    raise ValueError(f"Expected data for num_parties={config.num_parties}; got {data.num_parties} parties.")
  if config.public_subset > len(data.public) and "public_subset" not in config.unread_settings():
    raise ValueError(f"Expected public_subset={config.public_subset} <= {len(data.public)} public images.")
  if config.uses_sample and not config.with_replacement:
    for i, n in enumerate(data.party_sizes):
      if config.k > n:
        raise ValueError(f"Expected k={config.k} <= n={n} (party {i}) for sampling without replacement.")
      check_sampling_size(n, with_replacement=False)
  if config.uses_sample and config.with_replacement:
    _check_sample_memory(config, data)
  # Fail before any training if the privacy of this schedule cannot be stated.
  if config.uses_sample:
    for n in set(data.party_sizes):
      NfdpSampler(n, config.k, config.with_replacement).privacy(
          rounds=max(config.rounds, 1), resample_each_round=config.resample_each_round,
          relation=config.relation)
  if config.method == "ldp":
    for n in set(data.party_sizes):
      _ldp_delta(config, n)
    if config.rounds == 0:
      raise ValueError("Expected rounds >= 1 for method='ldp'.")


def _host_memory_bytes() -> int | None:
  """The host's physical memory in bytes (None where the OS does not say)."""
  try:
    return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
  except (AttributeError, ValueError, OSError):
    return None


def _check_sample_memory(config: FedMDConfig, data: FedMDData) -> None:
  """Refuses a with-replacement k whose samples cannot fit in the host's memory, before any training.

  The parties' samples are held as k images each; k = 1e8 on 12x12 images ended in a MemoryError after the
  pre-training. (Without replacement k <= n: the samples are no larger than the data already loaded.)
  """
  memory = _host_memory_bytes()
  if memory is None:
    return
  per_record = int(np.prod(data.input_shape)) * max(p.images.itemsize for p in data.parties)
  need = config.num_parties * config.k * per_record
  if need > memory:
    raise ValueError(f"Expected k={config.k} with replacement to give samples that fit in memory: "
                     f"{config.num_parties} parties x {config.k} records x {per_record} bytes = "
                     f"{need / 2**30:.3g} GiB > {memory / 2**30:.3g} GiB on this host.")


def _check_types(config: Any, data: Any) -> None:
  """A config or data of another type (None, ``config.to_dict()``) was an AttributeError deep in the run."""
  kind = lambda x: "None" if x is None else type(x).__name__  # noqa: E731
  if not isinstance(config, FedMDConfig):
    raise ValueError(f"Expected config to be a FedMDConfig; got {kind(config)}.")
  if not isinstance(data, FedMDData):
    raise ValueError(f"Expected data to be a FedMDData (from load_fedmd_data or make_fedmd_data); got "
                     f"{kind(data)}.")


def _check_data(data: FedMDData) -> None:
  """A hand-built FedMDData, checked before any training: class counts, one image shape, label ranges.

  Unchecked, num_public_classes = 20 (of 16 classes) failed after training in numpy's argmax, 0 scored the
  private-task accuracy as the full one, one party's 10x10 images against 12x12 public ones failed in XLA
  after party 0 had trained, and an empty test set failed after training.
  """
  c = _validate.integer("data.num_classes", data.num_classes, minimum=2)
  pub = _validate.integer("data.num_public_classes", data.num_public_classes, minimum=1, maximum=c - 1)
  if not data.parties:
    raise ValueError("Expected data.parties to hold at least one party.")
  sets = [("data.public", data.public, 0, pub), ("data.test", data.test, pub, c)]
  sets += [(f"data.parties[{i}]", p, pub, c) for i, p in enumerate(data.parties)]
  for name, d, _, _ in sets:
    if not isinstance(d, ImageData):
      raise ValueError(f"Expected {name} to be an ImageData; got {type(d).__name__}.")
  shape = tuple(data.public.images.shape[1:])
  for name, d, low, high in sets:
    if tuple(d.images.shape[1:]) != shape:
      raise ValueError(f"Expected {name} images of shape [n, {', '.join(map(str, shape))}] (data.public's); got "
                       f"{list(d.images.shape)}.")
    if len(d) == 0 and name != "data.public":
      raise ValueError(f"Expected {name} to hold at least one image.")
    if len(d) and not (int(d.labels.min()) >= low and int(d.labels.max()) < high):
      raise ValueError(f"Expected {name} labels in [{low}, {high}) (public classes first, then the private "
                       f"task's); got [{int(d.labels.min())}, {int(d.labels.max())}].")


def _privacy_reports(config: FedMDConfig, data: FedMDData, oracles: list[SampleOracle] | None,
                     ldp_sigmas: list[float] | None, sens: float, count: int, secret: bool) -> list[dict]:
  reports = []
  drawn = (("The noise is", "recompute the noise and subtract it") if config.method == "ldp"
           else ("The samples are", "recompute which records were sampled"))
  key_warning = None if secret else accounting.PrivacyWarning(
      "randomness_from_run_key",
      f"{drawn[0]} drawn from run_fedmd's key, which this simulation derives from a seed (the CLI's --seed, "
      f"recorded in report.json). Anyone who knows it can {drawn[1]}: the statement holds only against an "
      "adversary who does not know the key. Use a secret seed (secret_seed=; CLI: --secret-randomness) for "
      "a real release.").to_dict()
  randomness = ("secret seed (not in this report)" if secret
                else "run key (derived from the recorded seed)")
  for i, n in enumerate(data.party_sizes):
    if config.uses_sample:
      rep = oracles[i].privacy(rounds=max(config.rounds, 1), relation=config.relation).to_dict()
      rep["method"] = config.method
      rep["draws"] = len(oracles[i].draws)
      rep["sample"] = "resampled each round" if len(oracles[i].draws) > 1 else "drawn once, reused"
      rep["released"] = ("nothing but the final model" if config.method != "nfdp"
                         else "public-set predictions every round and the final model" if config.rounds
                         else "the final model (no rounds, so no public-set predictions)")
    elif config.method == "ldp":
      acct = accounting.gaussian(ldp_sigmas[i], sensitivity=sens, relation=config.relation, count=count)
      target_delta = _ldp_delta(config, n)
      rep = {
          "method": "ldp", "n": n, "mechanism": "gaussian", "sigma": ldp_sigmas[i],
          "sensitivity": sens, "count": count, "relation": config.relation,
          "calibrated_to": {"epsilon": config.ldp_epsilon, "delta": target_delta},
          "epsilon_at_target_delta": acct.epsilon(target_delta),
          "delta_at_epsilon": {str(e): acct.delta(e) for e in (0.1, 1.0, config.ldp_epsilon, 8.0)},
          "note": ("Each party's Q x R noisy releases compose to one Gaussian with sigma/sqrt(QR). The "
                   "local model itself (trained on all of D_i) is not private; only releases are."),
          "warnings": [accounting.PrivacyWarning(
              "float_gaussian_output",
              "(eps, delta) holds for real-valued Gaussian noise. The release adds float32 jax.random.normal "
              "draws, built from 23-bit uniforms (a few million distinct values, |z| below about 5.4), so the set "
              "of reachable outputs depends on the clean value (Mironov 2012) and the float output is not "
              "covered by the statement.", {"sigma": ldp_sigmas[i]}).to_dict()],
      }
      if target_delta >= 1.0 / n:
        rep["warnings"].append(accounting.PrivacyWarning(
            "delta_at_least_1_over_n",
            f"delta={target_delta:.4g} >= 1/n={1.0 / n:.4g}: a mechanism that publishes one record verbatim "
            "meets such a delta (the default target is NFDP's own p = k/n).",
            {"delta": target_delta, "one_over_n": 1.0 / n}).to_dict())
    else:
      rep = {"method": config.method, "n": n, "guarantee": "none",
             "note": {"np": "FedMD without privacy: releases computed from all local data.",
                      "local": "nothing released; the local model is trained on all local data.",
                      "centralized": "the private data is pooled (no privacy at all)."}[config.method]}
    if config.uses_sample or config.method == "ldp":
      rep["randomness"] = randomness
      if key_warning is not None:
        rep.setdefault("warnings", []).append(key_warning)
    reports.append(rep)
  return reports


def _ldp_delta(config: FedMDConfig, n: int) -> float:
  """FedMD-LDP's target delta: ``ldp_delta`` or NFDP's p for the same n, k, sampling."""
  if config.ldp_delta is not None:
    return config.ldp_delta
  try:
    return accounting.nfdp_inclusion_probability(n, config.k, with_replacement=config.with_replacement,
                                                 relation=config.relation)
  except ValueError as err:
    if config.method != "ldp":
      raise
    # Else "Expected k=1000 <= n=10 for sampling without replacement" for a method that samples nothing.
    raise ValueError(f"{_validate.first_line(err).rstrip('.')} (method='ldp' samples no records: k only sets its "
                     "default ldp_delta, NFDP's p for the same n, k and sampling). Pass ldp_delta (CLI: "
                     "--ldp-delta) or a smaller k.") from None



def _table_epsilons(value: Any, config: FedMDConfig) -> tuple[float, ...] | None:
  """``ldp_table_epsilons`` as a tuple of floats in [0, MAX_LDP_EPSILON] (None: the default table).

  Only ``nfdp`` and ``ldp`` reports have the table: a non-empty one for another method is refused (it was ignored).
  """
  if value is None:
    return None
  try:
    if isinstance(value, (str, bytes)):
      raise TypeError
    items = tuple(value)
  except TypeError:
    raise ValueError(f"Expected ldp_table_epsilons to be a sequence of numbers >= 0; got {value!r}.") from None
  out = tuple(check_ldp_epsilon("ldp_table_epsilons", e, allow_zero=True) for e in items)
  if out and not config.has_ldp_table:
    raise ValueError(f"Expected no ldp_table_epsilons for method={config.method!r}: only nfdp and ldp reports have the "
                     f"FedMD-LDP sigma table (elsewhere they are ignored); got {out}.")
  if out and config.rounds == 0:
    raise ValueError(f"Expected no ldp_table_epsilons with rounds=0: the FedMD-LDP sigma table matches noise to the "
                     f"predictions released in rounds, and a run of no rounds releases none (they were ignored); got "
                     f"{out}.")
  return out


def run_fedmd(key: jax.Array, config: FedMDConfig, data: FedMDData, *,
              checkpoint_dir: Any = None, resume: bool = False, progress: bool = False,
              record_releases: bool = False, ldp_table_epsilons: Any = None,
              on_round_end: Callable[[int, dict], None] | None = None,
              secret_seed: int | None = None) -> FedMDResult:
  """Runs FedMD-NFDP or one of its baselines (``config.method``).

  Formal guarantees:
    ``nfdp``: every release and every final model depends on party i's
    records only through its sample(s), so party i is (eps, p_i)-DP for
    every eps >= 0 (one reused sample) or (eps, 1 - (1 - p_i)^R)-DP
    (resampled each round), p_i = k/n_i (WOR) or 1 - (1 - 1/n_i)^k (WR),
    and for no smaller delta; see ``result.privacy``. ``ldp``: the Q x R
    noisy releases of party i are (ldp_epsilon, ldp_delta)-DP (PLD
    accounting); its local model is not. ``np``, ``local``,
    ``centralized``: no guarantee.

  Args:
    key: root PRNG key, threefry2x32 (rbg keys are refused: their draws change under vmap).
    config: :class:`FedMDConfig`.
    data: :class:`FedMDData` with ``config.num_parties`` parties.
    checkpoint_dir: folder for the per-round checkpoint (None: none). One
      run at a time holds it (an exclusive ``flock``, as ``--out`` in the
      CLI); a run that fails before writing its first checkpoint removes
      the folders it created.
    resume: continue from the checkpoint in ``checkpoint_dir``.
    progress: show a tqdm progress bar over rounds.
    record_releases: keep every party's releases in ``result.releases``
      (and in the checkpoint; a resume must pass the same value).
    ldp_table_epsilons: epsilons of ``result.ldp_sigma_table``, finite and
      >= 0 (default :data:`~jaxdistill.fedmd.DEFAULT_LDP_EPSILONS`). Only
      ``nfdp`` and ``ldp`` runs have the table; other methods refuse a
      non-empty one.
    on_round_end: ``callback(round, info)`` after each round's checkpoint
      (None or a callable).
    secret_seed: None, or a SECRET integer in [0, 2**64) from which NFDP's
      samples and FedMD-LDP's noise are drawn instead of from ``key`` (see
      the module docstring). It is written to the checkpoint, never to the
      report; resume with the same value (:func:`checkpoint_secret_seed`
      reads it back). Methods without private randomness draw nothing from
      it, but it is still kept in the checkpoint and checked on resume.

  Returns:
    A :class:`FedMDResult`. It and its :meth:`~FedMDResult.to_report`
    (the CLI's report.json) are the experimenter's record, not a DP
    release: they hold every party's exact size n (with 1/n and the
    paper's epsilon, functions of n, which under the default add/remove
    relation is itself private) and the accuracies of models trained on
    private data. The privacy statements cover only what the parties
    release in the run: the per-round releases (and, for ``nfdp``, the
    final models).

  Raises:
    ValueError: on a ``config`` or ``data`` of another type, a flag that is
      not a bool, a mismatch between config and data (N, k > n_i without
      replacement, a k with replacement whose samples would not fit in
      memory, public subset too large), an existing checkpoint without
      ``resume=True``, a checkpoint from a different run (other settings,
      data or key: the message names them; another ``secret_seed``; another
      ``record_releases``, vmap mode or ``jax_enable_x64`` mode, which train
      different parameters), a ``checkpoint_dir`` held by another run, bad
      ``ldp_table_epsilons`` (or a non-empty one for a method without the
      table, or none for ``nfdp`` with an ``ldp_delta``, the table's only
      use), a bad ``secret_seed`` or a non-callable
      ``on_round_end`` (all checked before any training). Private pixels
      are not checked (range, NaN): for ``nfdp`` even whether the run
      raises must depend on party i's records only through its sample, so
      unsampled records are never read (except, with ``checkpoint_dir``,
      to hash them into the checkpoint: a resume on other data is refused,
      and that compares the data with its own earlier copy, releasing
      nothing).
  """
  _check_types(config, data)  # before claimed_dir creates a folder
  resume = _validate.boolean("resume", resume)
  progress = _validate.boolean("progress", progress)
  record_releases = _validate.boolean("record_releases", record_releases)
  with contextlib.ExitStack() as held:
    if checkpoint_dir is not None:
      # One run at a time per checkpoint folder (two runs would overwrite each other's rounds); a run that
      # fails before its first checkpoint removes the folders it created. The CLI also holds --out.
      checkpoint_dir = held.enter_context(claimed_dir("checkpoint_dir", checkpoint_dir, files=(CHECKPOINT_NAME,)))
    return _run_fedmd(key, config, data, checkpoint_dir=checkpoint_dir, resume=resume, progress=progress,
                      record_releases=record_releases, ldp_table_epsilons=ldp_table_epsilons,
                      on_round_end=on_round_end, secret_seed=secret_seed)


def _run_fedmd(key: jax.Array, config: FedMDConfig, data: FedMDData, *, checkpoint_dir: pathlib.Path | None,
               resume: bool, progress: bool, record_releases: bool, ldp_table_epsilons: Any,
               on_round_end: Callable[[int, dict], None] | None, secret_seed: int | None) -> FedMDResult:
  key = _validate.prng_key("key", key, threefry=True)  # the same samples and batches vmapped or looped
  secret_seed = _keys.check_secret_seed("secret_seed", secret_seed)
  rand_root = key if secret_seed is None else _keys.secret_key(secret_seed)  # samples and LDP noise only
  table_epsilons = _table_epsilons(ldp_table_epsilons, config)
  if config.method == "nfdp" and config.ldp_delta is not None and table_epsilons == ():
    raise ValueError(f"Expected ldp_table_epsilons other than () for method='nfdp' with ldp_delta="
                     f"{config.ldp_delta!r}: there ldp_delta is the sigma table's delta, and nothing else uses it.")
  if on_round_end is not None and not callable(on_round_end):
    raise ValueError(f"Expected on_round_end to be None or a callable; got {on_round_end!r}.")
  check_config(config, data, checkpoint_dir=checkpoint_dir, resume=resume)
  ckpt = None if checkpoint_dir is None else checkpoint_dir / CHECKPOINT_NAME  # created, checked and held
  vmap = _use_vmap(config)
  x64 = bool(jax.config.jax_enable_x64)  # the two modes train different parameters (optax's Adam)
  n_parties = config.num_parties
  q = min(config.public_subset, len(data.public))
  fingerprint = config.fingerprint(data.description)
  hashes = None if ckpt is None else _data_hashes(data)  # checkpoint only (see _data_hashes)
  description = json.loads(json.dumps(data.description, default=str))  # as the checkpoint's JSON holds it
  key_data = np.asarray(jax.random.key_data(key)).tolist()
  noise_root = rand_root
  if secret_seed is not None and config.method == "ldp":
    noise_root = _secret_noise_root(rand_root, fingerprint, key_data, data, hashes)
  # Stage timings are cumulative over sessions (a resume restores them); "earlier_sessions" is the wall time of
  # the sessions before this one, up to their last checkpoint (0 in a checkpoint written before it was kept).
  timings: dict[str, float] = {"pretrain": 0.0, "init_train": 0.0, "predict": 0.0, "digest": 0.0,
                               "revisit": 0.0, "evaluate": 0.0, "checkpoint": 0.0, "earlier_sessions": 0.0}
  t_start = time.perf_counter()

  # Models: one classifier per architecture; party i initialised from fold_in(init, i).
  specs = config.party_specs()
  groups: list[_Group] = []
  by_spec: dict[M.CNNSpec, list[int]] = {}
  for i, s in enumerate(specs):
    by_spec.setdefault(s, []).append(i)
  init_key = _phase(key, _INIT)
  for spec, parties in by_spec.items():
    models = [M.FedMDCNN(spec, data.num_classes, input_shape=data.input_shape,
                         rngs=nnx.Rngs(params=jax.random.fold_in(init_key, i))) for i in parties]
    clf = _classifier(models[0], config.learning_rate)
    states = [M.create(model, clf.tx)[1] for model in models]
    groups.append(_Group(spec, parties, clf, M.stack_states(states)))

  # Private views.
  oracles: list[SampleOracle] | None = None
  views: list[ImageData] | ImageData
  if config.uses_sample:
    oracles = [SampleOracle(p, NfdpSampler(len(p), config.k, config.with_replacement)) for p in data.parties]
  elif config.method == "centralized":
    views = ImageData(np.concatenate([p.images for p in data.parties]),
                      np.concatenate([p.labels for p in data.parties]), data.num_classes, "pooled")
  else:
    views = list(data.parties)

  def sample_views(r: int) -> list[ImageData]:
    """Round r's samples: draw 1 (r <= 1 or reused) or a fresh one per round."""
    out = []
    for i, o in enumerate(oracles):
      d = r - 1 if config.resample_each_round and r >= 1 else 0
      if len(o.draws) > d:
        out.append(o.replay(o.draws[d]))
      else:
        out.append(o.draw(jax.random.fold_in(_phase(rand_root, _SAMPLE, d + 1), i)))
    return out

  # LDP calibration: one release's L2 sensitivity and T = Q x R releases per party
  # (_check requires rounds >= 1 for ldp).
  sens = release_sensitivity(config.aggregation, config.ldp_clip if config.aggregation == "logits" else None)
  ldp_count = q * config.rounds
  ldp_sigmas = None
  if config.method == "ldp":
    ldp_sigmas = []
    for n in data.party_sizes:
      delta = _ldp_delta(config, n)
      try:
        if config.ldp_delta is None and delta >= _NO_GUARANTEE_DELTA:
          # Refused by rule, not left to the accountant (which reaches some such deltas: sigma 0.835 at
          # p = 1 - 6e-10 after 44 s of PLDs, the calibration that had failed before).
          raise ValueError(f"a delta of {_NO_GUARANTEE_DELTA} or more is no guarantee")
        ldp_sigmas.append(calibrate_ldp_sigma(config.ldp_epsilon, delta, sensitivity=sens, count=ldp_count,
                                              relation=config.relation))  # memoised per (eps, delta, T)
      except ValueError as err:
        if config.ldp_delta is not None:
          raise ValueError(f"FedMD-LDP cannot be calibrated to ldp_epsilon={config.ldp_epsilon:g} at "
                           f"ldp_delta={delta:g}: {_validate.first_line(err)}") from None
        why = _validate.first_line(err).rstrip(".")
        raise ValueError(f"FedMD-LDP cannot be calibrated to ldp_epsilon={config.ldp_epsilon:g} at its default "
                         f"ldp_delta, NFDP's p = {delta:.10g} for n={n}, k={config.k}, "
                         f"{'WR' if config.with_replacement else 'WOR'} (method='ldp' samples no records: k only "
                         f"sets this default): {why}. Pass ldp_delta (CLI: --ldp-delta) or a smaller k.") from None
    # Releases are float32: a noise draw (|z| < 6 for jax.random.normal) summed over the parties must stay finite.
    limit = float(np.finfo(np.float32).max) / (8.0 * n_parties)
    if max(ldp_sigmas) > limit:
      clip = f"ldp_clip={config.ldp_clip:g}, " if config.aggregation == "logits" else ""
      raise ValueError(f"FedMD-LDP would need a noise standard deviation of {max(ldp_sigmas):.3g} per release "
                       f"({clip}ldp_epsilon={config.ldp_epsilon:g}), beyond what float32 releases of {n_parties} "
                       f"parties can hold ({limit:.3g}); lower {'ldp_clip or ' if clip else ''}raise ldp_epsilon.")

  # The LDP sigma table of the report, built here so that its errors also come before any release.
  table = None
  if config.has_ldp_table and config.rounds > 0:
    # The run's own delta, 1 - (1 - p)^R, when resampled: matching LDP to one draw's p overstated its sigma (19.8x
    # at eps = 0 for n = 2880, k = 3, R = 20), flattering NFDP.
    resampled = config.resample_each_round and config.ldp_delta is None
    schedule = (f"resampled in each of {config.rounds} rounds: 1 - (1 - p)^{config.rounds}" if resampled
                else "drawn once")

    def nfdp_delta(n: int) -> float:
      if resampled:
        return accounting.nfdp_privacy(n, config.k, with_replacement=config.with_replacement,
                                       relation=config.relation, rounds=max(config.rounds, 1),
                                       resample_each_round=True).flat_delta
      return _ldp_delta(config, n)

    # The run's NFDP guarantee is its weakest party's: the smallest party has the largest delta k/n. Party 0 alone
    # understated it for unequal parties (Dirichlet: sizes 34, 13, 73 gave 0.088 where party 1 has 0.23).
    deltas = [nfdp_delta(n) for n in data.party_sizes]
    i0 = int(np.argmax(deltas))
    n0, p0 = data.party_sizes[i0], deltas[i0]
    source = (f"the largest NFDP delta over the parties, party {i0}'s {p0:.6g} (n={n0}, k={config.k}, "
              f"{'WR' if config.with_replacement else 'WOR'}, {config.relation}, {schedule})"
              if config.ldp_delta is None else f"the configured ldp_delta = {p0:.6g} (not NFDP's delta)")
    rows, skipped, reason = [], [], ""
    for eps in DEFAULT_LDP_EPSILONS if table_epsilons is None else table_epsilons:
      # A side table never blocks the run: at a delta p near 1 (k >> n with replacement; k = n) it has no rows
      # but eps = 0, where a failed calibration was the run's error ("Expected delta=1.0 in (0, 1)").
      if eps > 0 and p0 >= _NO_GUARANTEE_DELTA:
        skipped.append(eps)
        continue
      try:
        rows += ldp_sigma_table(p0, sensitivity=sens, count=ldp_count, relation=config.relation, epsilons=(eps,))
      except ValueError as err:
        skipped.append(eps)
        reason = reason or _validate.first_line(err)
    table = {
        "matched_to": (f"delta = {source}; NFDP is (eps, delta)-DP for every eps >= 0, so each row gives the "
                       "Gaussian sigma per release for FedMD-LDP to be (eps, delta)-DP; eps = 0 is the sigma "
                       "whose whole profile lies below delta"),
        "delta": p0, "count": ldp_count, "sensitivity": sens, "rows": rows,
    }
    if skipped:
      why = (f"a delta of {_NO_GUARANTEE_DELTA} or more is no privacy guarantee, so no sigma is calibrated to it"
             if p0 >= _NO_GUARANTEE_DELTA else reason.rstrip("."))
      table["skipped_epsilons"] = skipped
      table["note"] = (f"No row for epsilon {', '.join(f'{e:g}' for e in skipped)} at delta = {p0:.10g}: {why}. "
                       "The run itself is unaffected.")

  acc_rows: list[np.ndarray] = []
  eval_rounds: list[int] = []
  subsets: list[np.ndarray] = []
  consensus: list[np.ndarray] = []
  releases: list[np.ndarray] = []
  start_round = 0
  resumed_from = None

  if ckpt is not None and resume and ckpt.exists():
    meta, arrays = _read_checkpoint(ckpt)
    # Checkpoints written before data_hashes were stored are matched on the data's description alone.
    if (meta.get("fingerprint") != fingerprint or meta.get("key") != key_data
        or meta.get("data_hashes", hashes) != hashes):
      diffs = _run_differences(meta, config, description, hashes, key_data)
      what = "; ".join(diffs[:4]) + (f"; and {len(diffs) - 4} more" if len(diffs) > 4 else "")
      raise ValueError(f"Checkpoint {ckpt} belongs to a different run ({what or 'configuration, data or seed differ'})"
                       ": resume with the settings, data and seed it was made with, or start afresh in another "
                       "checkpoint_dir (CLI: --out).")
    if meta.get("secret_seed") != secret_seed:  # never echo a secret
      had = "a secret_seed" if meta.get("secret_seed") is not None else "no secret_seed"
      given = "another one" if secret_seed is not None and had == "a secret_seed" else (
          "one" if secret_seed is not None else "none")
      raise ValueError(f"Checkpoint {ckpt} was made with {had} (CLI: --secret-randomness) and this call passes "
                       f"{given}: resuming would draw the samples or noise of the remaining rounds from another "
                       "key.")
    if config.collaborates:  # (methods without releases record none either way)
      recorded = meta.get("record_releases", "releases" in arrays)  # older checkpoints: whether it holds them
      if recorded != record_releases:
        lost = ("drop the releases of the rounds saved there from this result and from the checkpoint"
                if recorded else "return releases of the remaining rounds only, misaligned with public_subsets")
        raise ValueError(f"Checkpoint {ckpt} was made with record_releases={recorded} and this call passes "
                         f"record_releases={record_releases}: resuming would {lost}. Pass "
                         f"record_releases={recorded}.")
    saved_x64 = meta.get("x64", x64)  # older checkpoints did not record it
    if saved_x64 != x64:
      # Adam's bias correction runs in float64 under x64 (optax), so the two modes train different parameters: a
      # run stopped in one and resumed in the other matched neither uninterrupted run, without a word.
      raise ValueError(f"Checkpoint {ckpt} was trained with jax_enable_x64={saved_x64} and this process has "
                       f"jax_enable_x64={x64}: resuming would mix the two, which train different parameters "
                       "(optax's Adam). Resume with the mode it was made in.")
    saved_vmap = meta.get("vmap", vmap)  # older checkpoints did not record it
    if saved_vmap != vmap:
      # vmap="auto" resolves by backend: a run stopped on CPU (looped) and resumed on GPU (vmapped) mixed the two,
      # its parameters differed from an uninterrupted run's, and the report recorded one mode.
      raise ValueError(f"Checkpoint {ckpt} was trained with vmap={'on' if saved_vmap else 'off'} and this call "
                       f"resolves vmap={config.vmap!r} to {'on' if vmap else 'off'} (backend "
                       f"{jax.default_backend()}): resuming would mix the two, which differ by float rounding. "
                       "Pass that vmap explicitly (CLI: --vmap).")
    _restore_states(ckpt, groups, arrays)
    start_round = resumed_from = int(meta["round"])
    if oracles is not None:
      for i, o in enumerate(oracles):
        o.restore([arrays[f"sample_{i}_{d}"] for d in range(meta["draws"][i])])
    acc_rows = list(arrays["accuracy"])
    eval_rounds = list(meta["eval_rounds"])
    subsets = list(arrays["subsets"]) if start_round > 0 and config.collaborates else []
    consensus = list(arrays["consensus"]) if start_round > 0 and config.collaborates else []
    if record_releases and "releases" in arrays:
      releases = list(arrays["releases"])
    for name, v in meta["timings"].items():
      timings[name] = v
  else:
    # Pre-training on the public labels (transfer learning), then T1 epochs on the private view.
    t = time.perf_counter()
    pub = data.public
    pub_id = _content_hash(pub)
    for g in groups:
      # Pre-training sees only public data, so its result is a pure function of this tuple:
      # sweeps over k, methods or sampling reuse it instead of recomputing it. The x64 mode and the backend round
      # differently (optax's Adam corrects its bias in float64 under x64): a run after one in the other mode
      # started from that mode's weights.
      memo = (tuple(key_data), g.spec, tuple(g.parties), data.num_classes, config.learning_rate,
              config.pretrain_epochs, config.public_batch_size, vmap and len(g.parties) > 1, pub_id,
              x64, jax.default_backend())
      if config.pretrain_epochs and memo in _PRETRAINED:
        g.state = _PRETRAINED[memo]
        continue
      _fit_group(g, _party_keys(_phase(key, _PRETRAIN), g.parties), pub.images, pub.labels, None,
                 epochs=config.pretrain_epochs, batch_size=config.public_batch_size, loss="cross_entropy",
                 shared=True, vmap=vmap, learning_rate=config.learning_rate, when="in the pre-training on the "
                 "public labels")
      if config.pretrain_epochs:
        if len(_PRETRAINED) >= _PRETRAINED_MAX:
          _PRETRAINED.pop(next(iter(_PRETRAINED)))
        _PRETRAINED[memo] = g.state
    jax.block_until_ready([g.state for g in groups])
    timings["pretrain"] = time.perf_counter() - t
    t = time.perf_counter()
    if config.uses_sample:
      views = sample_views(1 if config.rounds >= 1 else 0)
    _train_private(groups, views, _phase(key, _TRAIN1), epochs=config.init_epochs, config=config, vmap=vmap,
                   when="in the initial training on the private data")
    jax.block_until_ready([g.state for g in groups])
    timings["init_train"] = time.perf_counter() - t
    t = time.perf_counter()
    acc_rows.append(_evaluate(groups, data.test, n_parties, vmap, data.num_public_classes,
                              config.learning_rate, "after the initial training"))
    eval_rounds.append(0)
    timings["evaluate"] += time.perf_counter() - t

  def save_checkpoint(r: int) -> None:
    """Writes the state after round ``r`` (0: after the initial training, before the first release)."""
    t = time.perf_counter()
    meta = {"fingerprint": fingerprint, "key": key_data, "secret_seed": secret_seed, "round": r,
            "eval_rounds": eval_rounds,
            "draws": [len(o.draws) for o in oracles] if oracles else [],
            # As a resume will need them: this session's time so far joins the earlier sessions'.
            "timings": {**timings,
                        "earlier_sessions": timings["earlier_sessions"] + time.perf_counter() - t_start},
            "config": config.to_dict(), "data": description, "data_hashes": hashes,
            "record_releases": record_releases, "vmap": vmap, "x64": x64}
    arrays = {"accuracy": np.stack(acc_rows)}
    if config.collaborates and subsets:
      arrays["subsets"] = np.stack(subsets)
      arrays["consensus"] = np.stack(consensus)
      if record_releases:
        arrays["releases"] = np.stack(releases)
    if oracles:
      for i, o in enumerate(oracles):
        for d, s in enumerate(o.draws):
          arrays[f"sample_{i}_{d}"] = s
    _save_checkpoint(ckpt, groups, meta, arrays)
    timings["checkpoint"] += time.perf_counter() - t

  if ckpt is not None and resumed_from is None and config.rounds >= 1:
    # Before round 1 releases anything: a run interrupted in round 1 (after its release, before the round's
    # checkpoint) then resumes from here with the same samples, secret seed and noise keys, so it releases
    # round 1 again bit for bit instead of from a fresh sample (a fresh secret seed, or another --seed, used to
    # pass: no checkpoint said that anything had been released).
    save_checkpoint(0)

  # Privacy: computed (and any accounting error raised) before anything is released.
  weights = None
  if config.weighting == "size":
    weights = np.asarray(data.party_sizes, np.float64)
  elif not isinstance(config.weighting, str):
    weights = np.asarray(config.weighting, np.float64)

  bar = None
  if progress:
    from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
    bar = tqdm(total=config.rounds, initial=start_round, desc=f"fedmd[{config.method}]", unit="round")
  try:
    for r in range(start_round + 1, config.rounds + 1):
      if config.uses_sample:
        views = sample_views(r)
      if config.collaborates:
        t = time.perf_counter()
        idx = np.sort(np.asarray(jax.random.choice(_phase(key, _PUBLIC, r), len(data.public), (q,),
                                                   replace=False)))
        x_pub = jnp.asarray(data.public.images[idx])
        logits = _predict_groups(groups, x_pub, n_parties, vmap)
        _check_trained(logits, config.learning_rate, f"on the public subset of round {r}")
        rel = release(logits, config.aggregation)
        if config.method == "ldp":
          if config.aggregation == "logits":
            rel = clip_rows(rel, config.ldp_clip)
          rel = _ldp_noised(_phase(noise_root, _NOISE, r), rel, ldp_sigmas)
        cons = aggregate(rel, weights)
        if config.method == "ldp" and config.aggregation != "logits":
          cons = project_to_simplex(cons)  # post-processing: valid soft targets
        cons = jax.block_until_ready(cons)
        timings["predict"] += time.perf_counter() - t
        subsets.append(idx)
        consensus.append(np.asarray(cons))
        if record_releases:
          releases.append(np.asarray(rel))
        t = time.perf_counter()
        loss = "mae" if config.aggregation == "logits" else "cross_entropy"
        for g in groups:
          _fit_group(g, _party_keys(_phase(key, _DIGEST, r), g.parties), x_pub, cons, None,
                     epochs=config.digest_epochs, batch_size=config.public_batch_size, loss=loss,
                     shared=True, vmap=vmap, learning_rate=config.learning_rate, when=f"in round {r}'s digest")
        jax.block_until_ready([g.state for g in groups])
        timings["digest"] += time.perf_counter() - t
      t = time.perf_counter()
      _train_private(groups, views, _phase(key, _REVISIT, r), epochs=config.revisit_epochs, config=config,
                     vmap=vmap, when=f"in round {r}'s revisit")
      jax.block_until_ready([g.state for g in groups])
      timings["revisit"] += time.perf_counter() - t
      if r % config.eval_every == 0 or r == config.rounds:
        t = time.perf_counter()
        acc_rows.append(_evaluate(groups, data.test, n_parties, vmap, data.num_public_classes,
                                  config.learning_rate, f"after round {r}"))
        eval_rounds.append(r)
        timings["evaluate"] += time.perf_counter() - t
      info = {"round": r, "mean_accuracy": float(acc_rows[-1][0].mean()), "eval_round": eval_rounds[-1]}
      if ckpt is not None:
        save_checkpoint(r)
      if bar is not None:
        bar.set_postfix(acc=f"{info['mean_accuracy']:.3f}", refresh=False)
        bar.update(1)
      if on_round_end is not None:
        on_round_end(r, info)
  finally:
    if bar is not None:
      bar.close()

  timings["total_this_session"] = time.perf_counter() - t_start
  timings["total_all_sessions"] = timings["earlier_sessions"] + timings["total_this_session"]
  timings["train_total"] = sum(timings[k] for k in ("pretrain", "init_train", "digest", "revisit"))
  timings["vmap"] = vmap
  privacy = _privacy_reports(config, data, oracles, ldp_sigmas, sens, ldp_count, secret_seed is not None)
  q_rows = len(subsets)
  return FedMDResult(
      config=config, data_description=data.description, accuracy=np.stack(acc_rows)[:, 0],
      accuracy_private=np.stack(acc_rows)[:, 1],
      eval_rounds=eval_rounds, privacy=privacy, ldp_sigma_table=table, timings=timings,
      samples=[list(o.draws) for o in oracles] if oracles else [[] for _ in range(n_parties)],
      public_subsets=np.stack(subsets) if q_rows else np.zeros((0, q), np.int64),
      consensus=np.stack(consensus) if q_rows else np.zeros((0, q, data.num_classes), np.float32),
      releases=np.stack(releases) if record_releases and releases else None,
      groups=[(g.spec, g.parties, g.clf, g.state) for g in groups], resumed_from=resumed_from)
