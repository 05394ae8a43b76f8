// `kolos data prepare --images`: images files (data.kind = "images") from a
// folder of PNG/JPEG images, one subfolder per class, or from .npy arrays.
//
// The file holds `images` (N x H x W x C uint8) and `labels` (N int64), as
// scripts/digits-to-h5.py writes them; a folder's class names go into the
// attribute `class_names` of `labels` (variable-length UTF-8 strings), which
// the image source does not need. The file is written as
// `<output>.tmp.<pid>`, fsynced and renamed over `output` (then the
// directory is fsynced): a reader sees the old file or the whole new one; on
// any error the temporary file is removed and `output` is left as it was.
#include <hdf5.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "hdf5_id.h"
#include "image_decode.h"
#include "kolos/core/error.h"
#include "kolos/modules/data.h"
#include "npy.h"
#include "kolos/core/posix_file.h"

namespace kolos::data {
namespace {

namespace fs = std::filesystem;
using internal::Hid;

std::string shape_text(int64_t h, int64_t w, int64_t c) {
  return detail::concat(h, "x", w, "x", c);
}

void check_square(const std::string& path, int64_t h, int64_t w) {
  if (h != w) {
    throw DataError(detail::concat(path, ": images of ", h, "x", w,
                                   " (H x W) are not square; the image models take "
                                   "model.image_size x model.image_size images, so crop or "
                                   "resize them first"));
  }
}

// Writes the images file atomically (see the file comment).
void write_images_file(const std::string& output, const std::vector<uint8_t>& pixels,
                       const ImagesPrepared& shape, const std::vector<int64_t>& labels) {
  if (output.empty()) {
    throw DataError("kolos data prepare: no output file; give one with -o out.h5");
  }
  const std::string temp = output + ".tmp." + std::to_string(::getpid());
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors are reported here, not printed
  posix::TempFileGuard guard(temp);
  const std::string where = "cannot write " + temp + " (temporary file for " + output + ")";
  {
    Hid file(H5Fcreate(temp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), &H5Fclose);
    if (!file.ok()) {
      throw DataError("cannot create " + temp + " (temporary file for " + output +
                      "): HDF5 could not create it (does the directory exist and is it "
                      "writable?)");
    }
    const hsize_t dims[4] = {static_cast<hsize_t>(shape.images),
                             static_cast<hsize_t>(shape.height),
                             static_cast<hsize_t>(shape.width),
                             static_cast<hsize_t>(shape.channels)};
    {
      Hid space(H5Screate_simple(4, dims, nullptr), &H5Sclose);
      Hid set(H5Dcreate2(file.get(), "images", H5T_STD_U8LE, space.get(), H5P_DEFAULT,
                         H5P_DEFAULT, H5P_DEFAULT),
              &H5Dclose);
      if (!set.ok() || H5Dwrite(set.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                pixels.data()) < 0) {
        throw DataError(where + ": writing dataset `images` failed (disk full?)");
      }
    }
    {
      Hid space(H5Screate_simple(1, dims, nullptr), &H5Sclose);
      Hid set(H5Dcreate2(file.get(), "labels", H5T_STD_I64LE, space.get(), H5P_DEFAULT,
                         H5P_DEFAULT, H5P_DEFAULT),
              &H5Dclose);
      if (!set.ok() || H5Dwrite(set.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                labels.data()) < 0) {
        throw DataError(where + ": writing dataset `labels` failed (disk full?)");
      }
      if (!shape.class_names.empty()) {
        Hid type(H5Tcopy(H5T_C_S1), &H5Tclose);
        H5Tset_size(type.get(), H5T_VARIABLE);
        H5Tset_cset(type.get(), H5T_CSET_UTF8);
        const hsize_t k = shape.class_names.size();
        Hid names_space(H5Screate_simple(1, &k, nullptr), &H5Sclose);
        Hid attr(H5Acreate2(set.get(), "class_names", type.get(), names_space.get(), H5P_DEFAULT,
                            H5P_DEFAULT),
                 &H5Aclose);
        std::vector<const char*> names;
        for (const std::string& name : shape.class_names) names.push_back(name.c_str());
        if (!attr.ok() || H5Awrite(attr.get(), type.get(), names.data()) < 0) {
          throw DataError(where + ": writing attribute `labels`.class_names failed");
        }
      }
    }
    if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0 || file.close() < 0) {
      throw DataError(where + ": closing the HDF5 file failed (disk full?)");
    }
  }
  {
    posix::ScopedFd fd(::open(temp.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid() || ::fsync(fd.get()) != 0) {
      throw DataError("cannot fsync " + temp + ": " + posix::errno_text(errno));
    }
  }
  if (::rename(temp.c_str(), output.c_str()) != 0) {
    throw DataError("cannot rename " + temp + " to " + output + ": " + posix::errno_text(errno));
  }
  guard.commit();
  posix::sync_parent_directory(output);
}

bool hidden(const fs::path& path) {
  const std::string name = path.filename().string();
  return !name.empty() && name[0] == '.';
}

// The files under a class folder, recursively, sorted by path; hidden
// files and folders are skipped.
std::vector<std::string> image_files(const fs::path& folder) {
  std::vector<std::string> files;
  std::error_code ec;
  fs::recursive_directory_iterator it(folder, fs::directory_options::follow_directory_symlink, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (hidden(it->path())) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_directory(ec)) continue;
    files.push_back(it->path().string());
  }
  if (ec) {
    throw DataError("cannot list class folder " + folder.string() + ": " + ec.message());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

ImagesPrepared prepare_images_from_folder(const std::string& dir, const std::string& output) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw DataError("--images " + dir +
                    (fs::exists(dir, ec) ? ": not a folder" : ": no such file or folder") +
                    "; give a folder with one subfolder of PNG/JPEG images per class, or a .npy "
                    "of images with --labels Y.npy");
  }
  std::vector<std::string> class_dirs;
  for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    if (hidden(it->path())) continue;
    if (it->is_directory(ec)) {
      class_dirs.push_back(it->path().filename().string());
    } else {
      throw DataError(it->path().string() +
                      ": a file directly in the images folder; put images in one subfolder "
                      "per class (" + dir + "/CLASS/IMAGE.png)");
    }
  }
  if (ec) throw DataError("cannot list images folder " + dir + ": " + ec.message());
  if (class_dirs.empty()) {
    throw DataError("--images " + dir +
                    ": the folder has no class subfolders; expected one subfolder of PNG/JPEG "
                    "images per class (" + dir + "/CLASS/IMAGE.png)");
  }
  std::sort(class_dirs.begin(), class_dirs.end());

  std::vector<std::pair<std::string, int64_t>> files;  // path, label
  for (size_t label = 0; label < class_dirs.size(); ++label) {
    const fs::path folder = fs::path(dir) / class_dirs[label];
    const std::vector<std::string> found = image_files(folder);
    if (found.empty()) {
      throw DataError("class folder " + folder.string() +
                      " holds no images; every class subfolder needs at least one PNG or JPEG "
                      "image (remove the folder to drop the class)");
    }
    for (const std::string& path : found) files.emplace_back(path, static_cast<int64_t>(label));
  }

  ImagesPrepared result;
  result.images = static_cast<int64_t>(files.size());
  result.classes = static_cast<int64_t>(class_dirs.size());
  result.class_names = class_dirs;
  std::vector<uint8_t> pixels;
  std::vector<int64_t> labels;
  labels.reserve(files.size());
  std::string first;
  for (const auto& [path, label] : files) {
    const internal::DecodedImage image =
        internal::decode_image(path, posix::read_whole_file(path, "image"));
    if (first.empty()) {
      check_square(path, image.height, image.width);
      first = path;
      result.height = image.height;
      result.width = image.width;
      result.channels = image.channels;
      pixels.reserve(files.size() * image.pixels.size());
    } else if (image.height != result.height || image.width != result.width ||
               image.channels != result.channels) {
      throw DataError(path + ": image of " + shape_text(image.height, image.width, image.channels) +
                      " (H x W x C), but the first image, " + first + ", is " +
                      shape_text(result.height, result.width, result.channels) +
                      "; all images must have the same size and channels");
    }
    pixels.insert(pixels.end(), image.pixels.begin(), image.pixels.end());
    labels.push_back(label);
  }
  write_images_file(output, pixels, result, labels);
  return result;
}

ImagesPrepared prepare_images_from_npy(const std::string& images_path,
                                       const std::string& labels_path,
                                       const std::string& output) {
  const internal::NpyArray images = internal::read_npy(images_path);
  if (images.kind != 'u' || images.itemsize != 1) {
    throw DataError(images_path + ": images of dtype '" + images.descr +
                    "'; expected uint8 ('|u1'): convert with array.astype(numpy.uint8) after "
                    "scaling to 0..255");
  }
  if (images.shape.size() != 3 && images.shape.size() != 4) {
    throw DataError(detail::concat(images_path, ": images of ", images.shape.size(),
                                   " dimensions; expected N x H x W x C or N x H x W"));
  }
  ImagesPrepared result;
  result.images = images.shape[0];
  result.height = images.shape[1];
  result.width = images.shape[2];
  result.channels = images.shape.size() == 4 ? images.shape[3] : 1;
  if (result.images < 1 || result.height < 1 || result.width < 1 || result.channels < 1) {
    throw DataError(images_path + ": the images array is empty (a dimension is 0)");
  }
  check_square(images_path, result.height, result.width);

  const internal::NpyArray labels = internal::read_npy(labels_path);
  const bool integer = (labels.kind == 'i' && (labels.itemsize == 8 || labels.itemsize == 4)) ||
                       (labels.kind == 'u' && labels.itemsize == 1);
  if (!integer) {
    throw DataError(labels_path + ": labels of dtype '" + labels.descr +
                    "'; expected int64, int32 or uint8");
  }
  if (labels.shape.size() != 1) {
    throw DataError(detail::concat(labels_path, ": labels of ", labels.shape.size(),
                                   " dimensions; expected one label per image (shape (N,))"));
  }
  if (labels.shape[0] != result.images) {
    throw DataError(detail::concat(labels_path, ": ", labels.shape[0], " labels, but ",
                                   images_path, " holds ", result.images,
                                   " images; expected one label per image"));
  }
  std::vector<int64_t> values(static_cast<size_t>(result.images));
  for (int64_t i = 0; i < result.images; ++i) {
    const int64_t label = labels.integer(i);
    if (label < 0) {
      throw DataError(detail::concat(labels_path, ": label [", i, "] = ", label,
                                     " is negative; labels are 0..classes-1"));
    }
    values[static_cast<size_t>(i)] = label;
    result.classes = std::max(result.classes, label + 1);
  }
  write_images_file(output, images.data, result, values);
  return result;
}

}  // namespace kolos::data
