"""gcc.geometry against hand-computed cases (UE conventions: X forward, Y right, Z up, cm, degrees)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gcc.geometry import NEAR_CM, Cameras, ground_points, pixel_grid, rotation_axes

S = 1 / math.sqrt(2)


def cam(location=(0, 0, 0), rotation=(0, 0, 0), fov=90.0, ortho_width=None, src_hw=(100, 200), dst_hw=(50, 100)):
    """One camera: perspective with horizontal `fov`, or orthographic when `ortho_width` is given."""
    ortho = ortho_width is not None
    return Cameras(
        location=np.array([location], dtype=np.float64),
        rotation=np.array([rotation], dtype=np.float64),
        orthographic=np.array([ortho]),
        fov_deg=np.array([np.nan if ortho else fov]),
        ortho_width=np.array([ortho_width if ortho else np.nan]),
        src_hw=src_hw,
        dst_hw=dst_hw,
    )


def ray(c: Cameras, u: float, v: float):
    o, d = c.rays(np.array([[u, v]], dtype=np.float64))
    return o[0, 0], d[0, 0]


# ---- rotations -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "rotation, fwd, right, up",
    [
        ((0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1)),
        ((0, 90, 0), (0, 1, 0), (-1, 0, 0), (0, 0, 1)),  # yaw 90: forward = +Y
        ((-90, 0, 0), (0, 0, -1), (0, 1, 0), (1, 0, 0)),  # pitch -90: looking down, image up = +X
        ((90, 0, 0), (0, 0, 1), (0, 1, 0), (-1, 0, 0)),  # pitch +90: looking up
        ((0, 0, 90), (1, 0, 0), (0, 0, -1), (0, 1, 0)),  # roll 90 (UE FRotationMatrix): right -> -Z, up -> +Y
        ((-30, 90, 0), (0, math.cos(math.pi / 6), -0.5), (-1, 0, 0), (0, 0.5, math.cos(math.pi / 6))),
        ((0, 45, 0), (S, S, 0), (-S, S, 0), (0, 0, 1)),
    ],
)
def test_rotation_axes(rotation, fwd, right, up):
    axes = rotation_axes(np.array(rotation, dtype=np.float64))
    np.testing.assert_allclose(axes, np.array([fwd, right, up], dtype=np.float64), atol=1e-12)


def test_rotation_axes_orthonormal_batch():
    rot = np.random.default_rng(0).uniform(-180, 180, size=(7, 3))
    axes = rotation_axes(rot)
    assert axes.shape == (7, 3, 3)
    np.testing.assert_allclose(axes @ np.swapaxes(axes, -1, -2), np.broadcast_to(np.eye(3), (7, 3, 3)), atol=1e-12)
    np.testing.assert_allclose(np.linalg.det(axes), 1.0, atol=1e-12)


# ---- pixels and rays -----------------------------------------------------------------------------------
def test_dst_to_ndc_pixel_centres():
    c = cam(src_hw=(4, 4), dst_hw=(2, 2))
    np.testing.assert_allclose(c.dst_to_ndc(np.array([[0, 0], [1, 1], [1, 0]])), [[-0.5, 0.5], [0.5, -0.5], [0.5, 0.5]])
    # resampling: dst pixel centre -> src pixel centre (src 720x1248 -> dst 480x832, scale 1.5)
    c = cam(src_hw=(720, 1248), dst_hw=(480, 832))
    np.testing.assert_allclose(c.dst_to_ndc(np.array([[0, 0]]))[0], [2 * 0.75 / 1248 - 1, 1 - 2 * 0.75 / 720])


def test_perspective_centre_ray_is_forward():
    for rotation in [(0, 0, 0), (-40, 120, 15), (-90, 0, 0)]:
        c = cam(location=(10, 20, 30), rotation=rotation, src_hw=(5, 7), dst_hw=(5, 7))
        o, d = ray(c, 3, 2)  # the centre pixel of an odd grid
        np.testing.assert_allclose(o, [10, 20, 30])
        np.testing.assert_allclose(d, rotation_axes(np.array(rotation, dtype=np.float64))[0], atol=1e-12)


def test_perspective_edges_at_half_fov():
    c = cam(fov=90.0, src_hw=(100, 200), dst_hw=(50, 100))
    # left edge, mid-height (continuous pixel coords): 45 degrees to the left
    np.testing.assert_allclose(ray(c, -0.5, 24.5)[1], [S, -S, 0], atol=1e-12)
    np.testing.assert_allclose(ray(c, 99.5, 24.5)[1], [S, S, 0], atol=1e-12)
    # top edge: vertical half-extent = tan(45) * H / W = 0.5 (square pixels)
    np.testing.assert_allclose(ray(c, 49.5, -0.5)[1], np.array([1, 0, 0.5]) / math.sqrt(1.25), atol=1e-12)
    # a corner pixel centre: ndc x = 1/W - 1 = -0.99, ndc y = 1 - 1/H = 0.98
    d = ray(c, 0, 0)[1]
    np.testing.assert_allclose(d, np.array([1, -0.99, 0.98 * 0.5]) / np.linalg.norm([1, -0.99, 0.49]), atol=1e-12)
    for fov in (60.0, 100.0):
        d = ray(cam(fov=fov), -0.5, 24.5)[1]
        assert math.degrees(math.acos(d[0])) == pytest.approx(fov / 2)


def test_image_plane_half_extents_are_the_tangents_or_the_half_ortho_width_with_the_source_aspect():
    both = cam(fov=90.0, src_hw=(100, 200))[[0, 0]]
    both.orthographic[1], both.ortho_width[1] = True, 300.0
    half_w, half_h = both.image_plane_half_extents()
    np.testing.assert_allclose(half_w, [1.0, 150.0])  # tan(90° / 2) at unit distance; 300 cm / 2
    np.testing.assert_allclose(half_h, [0.5, 75.0])  # × H / W of the source frame (square pixels)


def test_orthographic_rays_parallel_and_offset():
    c = cam(location=(100, 200, 1000), rotation=(-90, 0, 0), ortho_width=2000.0)
    _o, d = c.rays(pixel_grid(c.dst_hw, stride=7))
    np.testing.assert_allclose(d[0], np.broadcast_to([0, 0, -1], d[0].shape), atol=1e-12)
    # looking down: right = +Y, up = +X; left edge -> -width/2 along Y, top edge -> +height/2 along X
    np.testing.assert_allclose(ray(c, -0.5, 24.5)[0], [100, 200 - 1000, 1000], atol=1e-9)
    np.testing.assert_allclose(ray(c, 99.5, 24.5)[0], [100, 200 + 1000, 1000], atol=1e-9)
    np.testing.assert_allclose(ray(c, 49.5, -0.5)[0], [100 + 500, 200, 1000], atol=1e-9)
    np.testing.assert_allclose(ray(c, 49.5, 24.5)[0], [100, 200, 1000], atol=1e-9)


# ---- projection ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(rotation=(-35, 70, 0), fov=75.0),
        dict(rotation=(-20, -30, 25), fov=60.0),
        dict(rotation=(-60, 10, -15), ortho_width=3000.0),
    ],
)
def test_project_inverts_rays(kwargs):
    c = cam(location=(50, -80, 900), src_hw=(90, 160), dst_hw=(45, 80), **kwargs)
    pix = np.random.default_rng(1).uniform(-0.5, 79.5, size=(40, 2)) * [1, 45 / 80]
    o, d = c.rays(pix)
    dist = np.random.default_rng(2).uniform(100, 5000, size=(1, 40, 1))
    uv, fwd, _ = c.project((o + d * dist)[0])
    np.testing.assert_allclose(uv[0], pix + 0.5, atol=1e-7)  # continuous: pixel index + 0.5 at its centre
    assert np.all(fwd > 0)


def test_reversed_z_depth():
    c = cam(location=(0, 0, 0), fov=90.0)
    uv, fwd, depth = c.project(np.array([[200.0, 0, 0], [10.0, 0, 0], [1000.0, 300.0, 0], [-50.0, 0, 0]]))
    np.testing.assert_allclose(fwd[0], [200, 10, 1000, -50])
    np.testing.assert_allclose(depth[0, :3], [NEAR_CM / 200, 1.0, NEAR_CM / 1000])  # near plane -> 1
    np.testing.assert_allclose(uv[0, 0], [50, 25])  # straight ahead -> image centre
    np.testing.assert_allclose(uv[0, 2], [(0.3 + 1) / 2 * 100, 25])  # 0.3 of the half width right
    assert np.all(np.isnan(uv[0, 3]))  # behind the camera
    o = cam(location=(0, 0, 0), ortho_width=2000.0)
    uv, fwd, depth = o.project(np.array([[300.0, 500.0, -250.0]]))
    np.testing.assert_allclose(depth[0], [300.0])
    np.testing.assert_allclose(uv[0, 0], [(0.5 + 1) / 2 * 100, (1 + 0.5) / 2 * 50])


# ---- ground points -------------------------------------------------------------------------------------
def test_ground_points_looking_down():
    c = cam(location=(100, 200, 1000), rotation=(-90, 0, 0), fov=90.0)
    px = np.array([[49.5, 24.5], [-0.5, 24.5], [99.5, 24.5], [49.5, -0.5]])
    np.testing.assert_allclose(
        ground_points(c, px, 0.0)[0], [[100, 200], [100, -800], [100, 1200], [600, 200]], atol=1e-9
    )
    # plane higher up -> half the distance
    np.testing.assert_allclose(
        ground_points(c, px, 500.0)[0], [[100, 200], [100, -300], [100, 700], [350, 200]], atol=1e-9
    )
    o = cam(location=(100, 200, 1000), rotation=(-90, 0, 0), ortho_width=2000.0)
    np.testing.assert_allclose(
        ground_points(o, px, -50.0)[0], [[100, 200], [100, -800], [100, 1200], [600, 200]], atol=1e-9
    )


def test_ground_points_oblique():
    c = cam(location=(0, 0, 1000), rotation=(-45, 90, 0), src_hw=(5, 7), dst_hw=(5, 7))
    # centre ray: forward = (0, cos45, -sin45) -> hits Z = 0 at y = 1000
    np.testing.assert_allclose(ground_points(c, np.array([[3, 2]]), 0.0)[0, 0], [0, 1000], atol=1e-9)


def test_rays_above_horizon_are_nan():
    c = cam(location=(0, 0, 1000), rotation=(0, 0, 0), fov=90.0)
    xy = ground_points(c, pixel_grid(c.dst_hw), 0.0)[0].reshape(50, 100, 2)
    assert np.all(np.isnan(xy[:25]))  # upper half looks up (row 24 just above the horizon)
    assert np.all(np.isfinite(xy[25:]))  # lower half hits the ground
    assert np.all(xy[25:, :, 0] > 0)
    # pitch 30 > vertical half fov atan(0.5) = 26.6: every ray goes up
    assert np.all(np.isnan(ground_points(cam(location=(0, 0, 1000), rotation=(30, 0, 0)), pixel_grid((50, 100)), 0.0)))
    # a plane above a camera looking down; a horizontal orthographic camera (rays parallel to the plane)
    assert np.all(
        np.isnan(ground_points(cam(location=(0, 0, 1000), rotation=(-90, 0, 0)), pixel_grid((50, 100)), 2000.0))
    )
    o = cam(location=(0, 0, 1000), rotation=(0, 0, 0), ortho_width=500.0)
    assert np.all(np.isnan(ground_points(o, pixel_grid((50, 100)), 0.0)))


def test_camera_with_roll():
    c = cam(location=(0, 0, 1000), rotation=(0, 0, 90), fov=90.0)
    # roll 90: the image's right points down (-Z), its up points +Y
    np.testing.assert_allclose(ray(c, 99.5, 24.5)[1], [S, 0, -S], atol=1e-12)
    np.testing.assert_allclose(ground_points(c, np.array([[99.5, 24.5]]), 0.0)[0, 0], [1000, 0], atol=1e-9)
    np.testing.assert_allclose(ray(c, 49.5, -0.5)[1], np.array([1, 0.5, 0]) / math.sqrt(1.25), atol=1e-12)
    xy = ground_points(c, pixel_grid(c.dst_hw), 0.0)[0].reshape(50, 100, 2)
    assert np.all(np.isnan(xy[:, :50])) and np.all(np.isfinite(xy[:, 50:]))  # left half is sky
    # looking down with roll 30: the image centre still hits below the camera, the edges are rotated
    d = cam(location=(0, 0, 1000), rotation=(-90, 0, 30), fov=90.0)
    np.testing.assert_allclose(ground_points(d, np.array([[49.5, 24.5]]), 0.0)[0, 0], [0, 0], atol=1e-9)
    edge = ground_points(d, np.array([[99.5, 24.5]]), 0.0)[0, 0]  # right edge: 1000 cm along rolled right
    np.testing.assert_allclose(np.linalg.norm(edge), 1000.0)
    right = rotation_axes(np.array([-90.0, 0, 30]))[1]
    np.testing.assert_allclose(edge, 1000.0 * right[:2] / np.linalg.norm(right[:2]), atol=1e-9)
    np.testing.assert_allclose(abs(math.degrees(math.atan2(edge[0], edge[1]))), 30.0)


def test_meta_roundtrip_and_indexing():
    c = cam(location=(1, 2, 3), rotation=(-10, 20, 5), fov=70.0)
    o = cam(location=(4, 5, 6), rotation=(-80, 0, 0), ortho_width=1234.0)
    meta = {"src_hw": [100, 200], "dst_hw": [50, 100], "cameras": c.to_meta() + o.to_meta()}
    both = Cameras.from_meta(meta)
    assert len(both) == 2 and both.src_hw == (100, 200) and both.dst_hw == (50, 100)
    assert both.to_meta() == meta["cameras"]
    assert meta["cameras"][1] == {
        "location": [4.0, 5.0, 6.0],
        "rotation": [-80.0, 0.0, 0.0],
        "projection": "orthographic",
        "ortho_width": 1234.0,
    }
    np.testing.assert_allclose(both[1].rays(np.array([[3, 4]]))[0], o.rays(np.array([[3, 4]]))[0])
    assert len(both[0]) == 1 and not both[0].orthographic[0]


def test_pixel_grid():
    g = pixel_grid((8, 12), stride=4, offset=2)
    assert g.shape == (6, 2)
    np.testing.assert_array_equal(g[:4], [[2, 2], [6, 2], [10, 2], [2, 6]])  # (u, v), row-major
