"""Sources: documents from text globs across files, paragraph splitting, tfds (faked, and a real dataset
built here as ArrayRecord and read without TensorFlow)."""

import sys
import types

import pytest

from bertjax.core.errors import UserError
from bertjax.data import sources


def _write(path, text, mode="w"):
  with open(path, mode) as f:
    f.write(text)
  return path


def test_text_glob_reads_blank_line_documents_across_files_in_sorted_order(tmp_path):
  _write(tmp_path / "b.txt", "Third doc.\n\n\n")
  _write(tmp_path / "a.txt", "First one.\nStill first.\n\nSecond doc.\n")  # the file end ends a document
  _write(tmp_path / "c.txt", b"Fourth \xff bad line\nFourth doc.\n", "wb")
  stats = sources.SourceStats()
  docs = list(sources.documents(f"text:{tmp_path}/*.txt", stats))
  assert docs == [["First one.", "Still first."], ["Second doc."], ["Third doc."], ["Fourth doc."]]
  assert (stats.documents, stats.sentences, stats.invalid_lines) == (4, 5, 1)
  reader = sources.open_source(f"text:{tmp_path}/*.txt")
  assert reader.unit == "bytes" and reader.total == sum(p.stat().st_size for p in tmp_path.iterdir())
  stats = sources.SourceStats()
  list(reader.read(stats))
  assert stats.progress == reader.total


def test_split_paragraphs_ends_segments_at_sentence_boundaries(tmp_path):
  _write(tmp_path / "wiki.txt", "Dr. Smith arrived. He sat down! Was it late?\nA second paragraph here.\n")
  spec = f"text:{tmp_path}/wiki.txt"
  assert list(sources.documents(spec, sources.SourceStats())) == [
      ["Dr. Smith arrived. He sat down! Was it late?", "A second paragraph here."]]
  stats = sources.SourceStats()
  assert list(sources.documents(spec, stats, split_paragraphs=True)) == [
      ["Dr. Smith arrived.", "He sat down!", "Was it late?", "A second paragraph here."]]
  assert stats.sentences == 4


@pytest.mark.parametrize("spec,message", [
    ("text:/nonexistent/*.txt", "no files match"),
    ("wikipedia", "unknown data source"),
    ("text:", "unknown data source"),
])
def test_bad_sources_raise_user_errors(spec, message):
  with pytest.raises(UserError, match=message):
    list(sources.documents(spec, sources.SourceStats()))


ARTICLES = [
    "Alpha is a letter. It comes first.\n\nIt is used in science.",
    "Beta follows alpha. It is the second letter.",
    "Gamma rays are energetic.\nThey come from space.",
]


def _fake_tfds(calls):
  """A stand-in for tensorflow_datasets with the calls the source makes: data_source for ArrayRecord
  datasets, load + as_numpy for the others."""
  module = types.ModuleType("tensorflow_datasets")
  examples = [{"title": b"t", "text": a.encode()} for a in ARTICLES]

  def data_source(name, split, data_dir):
    calls.append(dict(call="data_source", name=name, split=split, data_dir=data_dir))
    if name.startswith("tfrecord"):
      raise NotImplementedError("not ArrayRecord")
    return examples

  def load(name, split, shuffle_files, data_dir):
    calls.append(dict(call="load", name=name, split=split, shuffle_files=shuffle_files, data_dir=data_dir))
    return examples

  split_info = types.SimpleNamespace(num_examples=len(ARTICLES))
  module.data_source, module.load = data_source, load
  module.as_numpy = lambda ds: iter(ds)
  info = types.SimpleNamespace(splits={"train": split_info})
  module.builder = lambda name, data_dir: types.SimpleNamespace(info=info)
  return module


def test_tfds_source_gives_one_document_per_example_split_into_sentences(monkeypatch):
  calls = []
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", _fake_tfds(calls))
  reader = sources.open_source("tfds:wikipedia/20230601.en", tfds_data_dir="/data")
  assert reader.paragraphs and reader.total == 3 and reader.unit == "examples"
  stats = sources.SourceStats()
  docs = list(sources.documents("tfds:wikipedia/20230601.en:validation", stats))
  assert calls[-1] == dict(call="data_source", name="wikipedia/20230601.en", split="validation", data_dir=None)
  assert docs[0] == ["Alpha is a letter.", "It comes first.", "It is used in science."]
  assert docs[2] == ["Gamma rays are energetic.", "They come from space."]
  assert (stats.documents, stats.sentences, stats.progress) == (3, 7, 3)
  with pytest.raises(UserError, match="no feature 'body'"):
    list(sources.documents("tfds:wikipedia/20230601.en", sources.SourceStats(), tfds_text_key="body"))
  # A dataset prepared as TFRecord is not random-access: read through tfds.load (TensorFlow) instead.
  assert list(sources.documents("tfds:tfrecord_wiki", sources.SourceStats())) == docs
  assert [c["call"] for c in calls[-2:]] == ["data_source", "load"] and calls[-1]["shuffle_files"] is False


def test_tfds_source_without_tensorflow_datasets_says_how_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # makes the import fail
  with pytest.raises(UserError, match=r"bertjax\[tfds\]"):
    list(sources.documents("tfds:wikipedia/20230601.en", sources.SourceStats()))


_TINY_TFDS = []


def tiny_tfds(data_dir, articles) -> str:
  """Builds a tfds dataset of `articles` (feature "text", plus a "title") in `data_dir` as ArrayRecord,
  with tfds's own builder and no TensorFlow; returns its source string."""
  import tensorflow_datasets as tfds

  if not _TINY_TFDS:  # tfds registers builder classes by name: define it once per process

    class BertjaxTinyArticles(tfds.core.GeneratorBasedBuilder):
      VERSION = tfds.core.Version("1.0.0")
      articles = ()

      def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {"text": tfds.features.Text(), "title": tfds.features.Text()}))

      def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

      def _generate_examples(self):
        for i, text in enumerate(self.articles):
          yield i, {"text": text, "title": f"article {i}"}

    _TINY_TFDS.append(BertjaxTinyArticles)
  builder = _TINY_TFDS[0]
  builder.articles = tuple(articles)
  builder(data_dir=str(data_dir), file_format="array_record").download_and_prepare()
  return "tfds:bertjax_tiny_articles"


def test_a_real_tfds_dataset_is_read_without_tensorflow(tmp_path):
  spec = tiny_tfds(tmp_path, ARTICLES)
  reader = sources.open_source(spec, tfds_data_dir=str(tmp_path))
  assert reader.total == 3
  stats = sources.SourceStats()
  docs = list(sources.documents(spec, stats, tfds_data_dir=str(tmp_path)))
  # tfds stores examples in an order of its own (hashed keys): compare as a set, count exactly.
  assert stats.documents == 3 and ["Beta follows alpha.", "It is the second letter."] in docs
  assert sorted(map(len, docs)) == [2, 2, 3]
  assert "tensorflow" not in sys.modules
