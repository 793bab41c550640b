"""DetectionDataset items, caching, split-invariant augmentation, build_datasets."""
import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from extra_dataset import write_csv_dataset
from mdk.data.build import build_datasets
from mdk.data.dataset import DetectionDataset
from mdk.data.index import cached_records
from mdk.data.shapes import SHAPE_CLASSES, ensure_shapes_dataset
from mdk.data.voc import VOCReader
from mdk.errors import ConfigError, DataError
from mdk.models.heads import YoloV1Head
from mdk.models.yolo_codec import decode

CLASSES = list(SHAPE_CLASSES)
SIZE, S, B = 64, 4, 2
HEAD = YoloV1Head(len(CLASSES), B)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return ensure_shapes_dataset(tmp_path_factory.mktemp("d") / "shapes", num_train=10, num_val=4,
                                 image_size=SIZE, seed=2)


def make(root, tmp_path, **kw):
    args = dict(root=root, split="train", class_names=CLASSES, image_size=SIZE, grid=S,
                head=HEAD, augment=True, meta_dir=tmp_path / "meta", cache_images=False, seed=7)
    args.update(kw)
    records = cached_records(VOCReader(args["root"], CLASSES), args["split"], args["meta_dir"])
    return DetectionDataset(records=records, **args)


def sorted_boxes(boxes, labels):
    order = torch.argsort(boxes[:, 0] * 1000 + boxes[:, 1])
    return boxes[order], labels[order]


def test_item_shapes_and_plain_target_matches_gt(root, tmp_path):
    ds = make(root, tmp_path, augment=False)
    assert len(ds) == 10
    checked = 0
    for i in range(len(ds)):
        img, target, index = ds[i]
        assert img.shape == (3, SIZE, SIZE) and img.dtype == torch.uint8
        assert target.shape == (S, S, 5 * B + len(CLASSES)) and target.dtype == torch.float32
        assert index == i
        boxes, labels, difficult = ds.gt(i)
        assert boxes.dtype == torch.float32 and labels.dtype == torch.int64 and not difficult.any()
        det = decode(target.permute(2, 0, 1)[None], SIZE, boxes_per_cell=B)[0]
        if len(det["boxes"]) == len(boxes):     # one object per cell (else the codec keeps one)
            got, want = sorted_boxes(det["boxes"], det["labels"]), sorted_boxes(boxes, labels)
            torch.testing.assert_close(got[0], want[0], atol=1e-3, rtol=0)
            assert got[1].tolist() == want[1].tolist()
            checked += 1
    assert checked >= 6


def test_resize_scales_gt(root, tmp_path):
    full, half = make(root, tmp_path), make(root, tmp_path / "h", image_size=32)
    assert half[0][0].shape == (3, 32, 32)
    torch.testing.assert_close(half.gt(3)[0], full.gt(3)[0] / 2)


def test_cache_gives_identical_items(root, tmp_path):
    plain, cached = make(root, tmp_path), make(root, tmp_path, cache_images=True)
    assert cached.images.shape == (10, 3, SIZE, SIZE)
    for i in range(len(plain)):
        a, b = plain[i], cached[i]
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_augmentation_depends_only_on_seed_epoch_index(root, tmp_path):
    ds = make(root, tmp_path)
    torch.manual_seed(0)
    first = [ds[i] for i in range(len(ds))]
    torch.manual_seed(123)                                   # global RNG plays no part
    again = [ds[i] for i in reversed(range(len(ds)))][::-1]
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, again))
    plain = make(root, tmp_path, augment=False)
    assert sum(not torch.equal(a[0], plain[i][0]) for i, a in enumerate(first)) >= 8  # jitter etc.
    ds.set_epoch(1)
    assert sum(not torch.equal(a[0], ds[i][0]) for i, a in enumerate(first)) >= 8
    other_seed = make(root, tmp_path, seed=8)
    assert sum(not torch.equal(a[0], other_seed[i][0]) for i, a in enumerate(first)) >= 8


def test_augmented_boxes_stay_in_image(root, tmp_path):
    ds = make(root, tmp_path)
    for epoch in range(3):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            t = ds[i][1]
            det = decode(t.permute(2, 0, 1)[None], SIZE, boxes_per_cell=B)[0]
            assert ((det["boxes"] >= 0) & (det["boxes"] <= SIZE)).all()
            assert (t[..., 4] == 1).sum() == len(det["boxes"])


def collect(ds, **loader_kw):
    out = {}
    for imgs, targets, idx in DataLoader(ds, **loader_kw):
        for img, target, i in zip(imgs, targets, idx.tolist()):
            out[i] = (img, target)
    return out


def test_same_augmentation_across_workers_batches_and_order(root, tmp_path):
    ds = make(root, tmp_path, cache_images=True)
    ds.set_epoch(3)
    ref = collect(ds, batch_size=4, num_workers=0)
    other = collect(ds, batch_size=3, num_workers=2, shuffle=True,
                    generator=torch.Generator().manual_seed(5))
    assert sorted(ref) == sorted(other) == list(range(10))
    for i in ref:
        assert torch.equal(ref[i][0], other[i][0]) and torch.equal(ref[i][1], other[i][1])
    # two "ranks" each taking half the indices see the same samples as one process
    halves = {}
    for rank in range(2):
        halves.update(collect(torch.utils.data.Subset(ds, list(range(rank, 10, 2))), batch_size=2))
    assert all(torch.equal(ref[i][0], halves[i][0]) for i in ref)


def test_missing_image_at_load_names_file(root, tmp_path):
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    ds = make(copy, tmp_path)
    (copy / "JPEGImages" / "000004.jpg").unlink()
    with pytest.raises(DataError, match="000004.jpg: image listed in the meta file is missing"):
        ds[4]


def cfg(tmp_path, **over):
    base = OmegaConf.create({"paths": {"data": str(tmp_path / "data")},
                             "dataset": OmegaConf.load("conf/dataset/shapes.yaml")})
    base.dataset.generate.merge_with({"num_train": 6, "num_val": 3, "image_size": SIZE, "seed": 0})
    for k, v in over.items():
        OmegaConf.update(base, f"dataset.{k}", v)
    return base.dataset


def test_build_datasets_shapes(tmp_path):
    train, val = build_datasets(cfg(tmp_path), SIZE, S, HEAD, 0, tmp_path / "cache")
    assert (len(train), len(val)) == (6, 3)
    assert train.augment and not val.augment and train.images is not None
    assert (tmp_path / "data" / "shapes" / "manifest.json").is_file()
    assert len(list((tmp_path / "cache" / "meta").glob("shapes-*/train.txt"))) == 1


@pytest.mark.parametrize("over, kind, match", [
    ({"num_classes": 4}, ConfigError, "dataset.num_classes=4 but dataset.class_names has 5 names"),
    ({"generate._target_": None}, DataError, "dataset.generate=.* must be null or a node with a _target_"),
    ({"class_names": ["circle", "circle"]}, DataError, "has duplicates"),
    ({"train_split": "nope"}, DataError, "split file not found"),
])
def test_build_datasets_bad_config(tmp_path, over, kind, match):
    with pytest.raises(kind, match=match):
        build_datasets(cfg(tmp_path, **over), SIZE, S, HEAD, 0, tmp_path / "cache")


def test_a_dataset_is_its_yaml_not_a_name_in_a_list(tmp_path):
    """Any name works (it labels the folders: meta files here, checkpoints by paths.checkpoints);
    the data is made by whatever ``generate._target_`` names, called with root and class_names."""
    train, _ = build_datasets(cfg(tmp_path, name="mine", root=str(tmp_path / "mine")), SIZE, S,
                              HEAD, 0, tmp_path / "cache")
    assert len(train) == 6 and (tmp_path / "mine" / "manifest.json").is_file()
    assert len(list((tmp_path / "cache" / "meta").glob("mine-*/train.txt"))) == 1
    from mdk.compose import compose

    c = compose(["dataset=shapes", "dataset.name=mine", "model=gnetdet_small"])
    assert c.paths.checkpoints.endswith("gnetdet_small_mine")


def test_the_reader_class_is_config(tmp_path):
    """dataset.reader._target_ names the reader class (here one outside mdk, of a CSV format);
    its own keys are passed to it, and the dataset serves its records like any other's."""
    full, full_val = build_datasets(cfg(tmp_path), SIZE, S, HEAD, 0, tmp_path / "cache")
    assert type(full) is DetectionDataset
    for ds in (full, full_val):
        write_csv_dataset(ds.records, ds.root, tmp_path / "csv", ds.split, CLASSES)
    c = cfg(tmp_path, **{"reader": {"_target_": "extra_dataset.CSVReader", "limit": 2},
                         "root": str(tmp_path / "csv"), "generate": None})
    train, val = build_datasets(c, SIZE, S, HEAD, 0, tmp_path / "cache")
    assert type(train) is type(val) is DetectionDataset
    assert (len(train), len(val)) == (2, 2) and train.augment and not val.augment
    assert [r.image for r in train.records] == ["pics/000000.jpg", "pics/000001.jpg"]
    for i in range(2):
        assert torch.equal(train[i][1], full[i][1]) and torch.equal(train.image(i), full.image(i))
    # the val split alone: the same records, and the train split's records never read
    none, alone = build_datasets(c, SIZE, S, HEAD, 0, tmp_path / "cache_val", train=False)
    assert none is None and [r.image for r in alone.records] == [r.image for r in val.records]
    # the index cache holds the val split's files only (a full build writes train.* too)
    assert {p.name for p in (tmp_path / "cache_val").rglob("*.*")} == {"val.txt", "val.images.json"}
    with pytest.raises(DataError, match=r"^dataset.reader._target_='nowhere.Nothing' cannot be "
                                        r"imported \(No module named 'nowhere'\); name a reader "
                                        r"class as package.module.Class$"):
        build_datasets(cfg(tmp_path, **{"reader": {"_target_": "nowhere.Nothing"}}), SIZE, S, HEAD,
                       0, tmp_path / "cache")
    with pytest.raises(DataError, match=r"dataset.reader=.* must be null or a node with a _targ"):
        build_datasets(cfg(tmp_path, **{"reader": {"_target_": None}}), SIZE, S, HEAD, 0, tmp_path / "c")
    with pytest.raises(DataError, match=r"^dataset.reader._target_='mdk.data.dataset.Detection"
                                        r"Dataset' is not a dataset reader \(it needs the methods "
                                        r"check, count, records, sources"):
        build_datasets(cfg(tmp_path, **{"reader": {"_target_": "mdk.data.dataset.DetectionDataset"}}),
                       SIZE, S, HEAD, 0, tmp_path / "cache")
    with pytest.raises(DataError, match=r"^dataset.reader: mdk.data.voc.VOCReader does not take "
                                        r"these keys \(got an unexpected keyword argument 'limit'\)"):
        build_datasets(cfg(tmp_path, **{"reader.limit": 2}), SIZE, S, HEAD, 0, tmp_path / "cache")


def test_build_datasets_voc_root(tmp_path):
    voc = OmegaConf.load("conf/dataset/voc.yaml")
    assert voc.class_names is None and voc.num_classes is None   # read from the data
    with pytest.raises(DataError, match="dataset.root is not set"):
        build_datasets(voc, 448, 14, HEAD, 0, tmp_path)
    voc.class_names, voc.num_classes = ["a", "b"], 2
    voc.root = str(tmp_path / "VOCdevkit/VOC2007")
    with pytest.raises(DataError, match="VOC2007' does not exist"):
        build_datasets(voc, 448, 14, HEAD, 0, tmp_path)


def test_affine_boxes_follow_the_image_and_drop_mostly_outside():
    from torchvision.transforms.v2 import functional as F

    from mdk.data.augment import affine_boxes
    img = torch.zeros(3, 96, 96, dtype=torch.uint8)
    img[:, 20:50, 30:70] = 255                                   # box x 30..70, y 20..50
    box, label = torch.tensor([[30.0, 20.0, 70.0, 50.0]]), torch.tensor([1])
    for scale, shift in ((1.2, [-8.0, 5.0]), (0.8, [10.0, -4.0])):
        warped = F.affine(img, angle=0.0, translate=shift, scale=scale, shear=[0.0, 0.0])
        ys, xs = torch.nonzero(warped[0] > 127, as_tuple=True)
        seen = torch.tensor([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=torch.float32)
        got, lab = affine_boxes(box, label, scale, shift, 96)
        torch.testing.assert_close(got[0], seen, atol=1.0, rtol=0)
        assert lab.tolist() == [1]
    # 75 % of the box pushed out of the image: dropped; 30 % out: kept, clipped
    got, lab = affine_boxes(box, label, 1.0, [56.0, 0.0], 96)
    assert len(got) == 0 and len(lab) == 0
    got, lab = affine_boxes(box, label, 1.0, [38.0, 0.0], 96)
    torch.testing.assert_close(got, torch.tensor([[68.0, 20.0, 96.0, 50.0]]))
